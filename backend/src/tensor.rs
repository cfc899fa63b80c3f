//! [`HostTensor`]: the host-side f32 tensor weights are loaded into and devices upload from.

/// A dense row-major f32 tensor in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape {shape:?} vs {} elements",
            data.len()
        );
        HostTensor { shape, data }
    }
    /// Stacks matrices with equal column counts along rows.
    pub fn concat_rows(parts: &[HostTensor]) -> HostTensor {
        let cols = parts[0].shape[1];
        let rows = parts.iter().map(|p| p.shape[0]).sum();
        let mut data = Vec::with_capacity(rows * cols);
        for p in parts {
            assert_eq!(p.shape[1], cols);
            data.extend_from_slice(&p.data);
        }
        HostTensor {
            shape: vec![rows, cols],
            data,
        }
    }
}
