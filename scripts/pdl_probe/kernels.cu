// Two trivial kernels for pdl_probe.cpp: the second reads what the first wrote.
extern "C" __global__ void producer(int* x, int v) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    x[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
extern "C" __global__ void consumer(const int* x, int* y) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i] + 1;
}
