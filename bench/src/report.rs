//! Plots for benchmark reports, drawn as SVG by hand (no plotting dependency): latency CDFs on a
//! log time axis, and stacked bars of where time goes.

const COLORS: [&str; 8] = [
    "#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn header(w: f64, h: f64, title: &str) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="14">{title}</text>"#,
        w / 2.0
    )
}

/// CDFs of `series` (name, values in milliseconds) on a log-scaled time axis.
pub fn cdf_svg(series: &[(String, Vec<f64>)], title: &str, x_label: &str) -> String {
    let (w, h, l, b) = (720.0, 420.0, 70.0, 50.0);
    let (pw, ph) = (w - l - 20.0, h - b - 40.0);
    let all: Vec<f64> = series.iter().flat_map(|s| s.1.iter().copied()).collect();
    let lo = all
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1.0)
        .log10()
        .floor();
    let hi = all
        .iter()
        .copied()
        .fold(1.0, f64::max)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let x = |ms: f64| l + (ms.max(1.0).log10() - lo) / (hi - lo) * pw;
    let y = |q: f64| 40.0 + (1.0 - q) * ph;
    let mut s = header(w, h, title);
    s.push_str(&format!(r#"<line x1="{l}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{l}" y1="40" x2="{l}" y2="{}" stroke="black"/>"#, 40.0 + ph, l + pw, 40.0 + ph, 40.0 + ph));
    let mut e = lo;
    while e <= hi {
        let ms = 10f64.powf(e);
        s.push_str(&format!(r#"<line x1="{0}" y1="40" x2="{0}" y2="{1}" stroke="gainsboro"/><text x="{0}" y="{2}" text-anchor="middle">{3}</text>"#, x(ms), 40.0 + ph, 40.0 + ph + 16.0, if ms >= 1000.0 { format!("{} s", ms / 1000.0) } else { format!("{ms} ms") }));
        e += 1.0;
    }
    for q in [0.0, 0.25, 0.5, 0.75, 1.0] {
        s.push_str(&format!(
            r#"<text x="{}" y="{}" text-anchor="end">{q}</text>"#,
            l - 6.0,
            y(q) + 4.0
        ));
    }
    s.push_str(&format!(r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text><text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">fraction of requests</text>"#, l + pw / 2.0, h - 8.0, 40.0 + ph / 2.0, 40.0 + ph / 2.0));
    for (i, (name, values)) in series.iter().enumerate() {
        let mut v = values.clone();
        v.sort_by(f64::total_cmp);
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(k, &ms)| format!("{:.1},{:.1}", x(ms), y((k + 1) as f64 / v.len() as f64)))
            .collect();
        let c = COLORS[i % COLORS.len()];
        s.push_str(&format!(
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        ));
        s.push_str(&format!(r#"<rect x="{}" y="{}" width="14" height="3" fill="{c}"/><text x="{}" y="{}">{name}</text>"#, l + 12.0, 52.0 + 16.0 * i as f64, l + 32.0, 57.0 + 16.0 * i as f64));
    }
    s.push_str("</svg>\n");
    s
}

/// The smallest of 1, 2, 2.5 or 5 × 10^k that is at least `x` (axis steps with round labels).
fn nice_step(x: f64) -> f64 {
    let p = 10f64.powf(x.max(1e-9).log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|&v| v >= x * (1.0 - 1e-12))
        .unwrap_or(10.0 * p)
}

/// One bar per `(name, part values)`, the parts stacked in the order of `parts` (milliseconds).
pub fn stacked_bars_svg(
    bars: &[(String, Vec<f64>)],
    parts: &[&str],
    title: &str,
    y_label: &str,
) -> String {
    // Room on the right for the legend's part names.
    let legend = 40.0 + 7.0 * parts.iter().map(|p| p.len()).max().unwrap_or(0) as f64;
    let (l, h, b) = (70.0, 440.0, 110.0);
    let w = l + 90.0 * bars.len() as f64 + legend + 20.0;
    let (pw, ph) = (w - l - legend - 20.0, h - b - 40.0);
    let top = 4.0
        * nice_step(
            bars.iter()
                .map(|(_, v)| v.iter().sum::<f64>())
                .fold(1e-9, f64::max)
                / 4.0,
        );
    let y = |ms: f64| 40.0 + ph - ms / top * ph;
    let mut s = header(w, h, title);
    s.push_str(&format!(r#"<line x1="{l}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{l}" y1="40" x2="{l}" y2="{}" stroke="black"/>"#, 40.0 + ph, l + pw, 40.0 + ph, 40.0 + ph));
    for k in 0..=4 {
        let ms = top * k as f64 / 4.0;
        s.push_str(&format!(
            r#"<text x="{}" y="{}" text-anchor="end">{}</text><line x1="{l}" y1="{1}" x2="{}" y2="{1}" stroke="gainsboro"/>"#,
            l - 6.0,
            y(ms),
            ms,
            l + pw
        ));
    }
    s.push_str(&format!(r#"<text x="16" y="{0}" transform="rotate(-90 16 {0})" text-anchor="middle">{y_label}</text>"#, 40.0 + ph / 2.0));
    let slot = pw / bars.len().max(1) as f64;
    for (i, (name, values)) in bars.iter().enumerate() {
        let x0 = l + slot * i as f64 + slot * 0.2;
        let mut acc = 0.0;
        for (j, &v) in values.iter().enumerate() {
            s.push_str(&format!(
                r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                y(acc + v),
                slot * 0.6,
                (v / top * ph).max(0.0),
                COLORS[j % COLORS.len()]
            ));
            acc += v;
        }
        s.push_str(&format!(
            r#"<text x="{0:.1}" y="{1}" transform="rotate(35 {0:.1} {1})" font-size="11">{name}</text>"#,
            x0 + slot * 0.1,
            40.0 + ph + 14.0
        ));
    }
    for (j, p) in parts.iter().enumerate() {
        let c = COLORS[j % COLORS.len()];
        s.push_str(&format!(r#"<rect x="{}" y="{}" width="12" height="12" fill="{c}"/><text x="{}" y="{}">{p}</text>"#, l + pw + 20.0, 50.0 + 18.0 * j as f64, l + pw + 38.0, 60.0 + 18.0 * j as f64));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_well_formed_svg_with_every_series() {
        let cdf = cdf_svg(
            &[
                ("a".into(), vec![5.0, 50.0, 500.0]),
                ("b".into(), vec![2000.0]),
            ],
            "TTFT",
            "time",
        );
        assert!(cdf.starts_with("<svg") && cdf.trim_end().ends_with("</svg>"));
        assert_eq!(cdf.matches("<polyline").count(), 2);
        let bars = stacked_bars_svg(
            &[
                ("base".into(), vec![1.0, 2.0]),
                ("on".into(), vec![0.5, 0.2]),
            ],
            &["queue", "prefill"],
            "parts",
            "ms",
        );
        assert!(bars.contains(">queue<") && bars.contains(">on<"));
        assert_eq!(bars.matches("<rect").count(), 1 + 4 + 2);
        // The axis tops out at 4 round steps above the tallest bar (3.0): 0, 1, 2, 3, 4.
        assert!(bars.contains(">4<") && !bars.contains(">3.3<"));
    }

    #[test]
    fn axis_steps_are_round() {
        for (x, want) in [
            (6.8, 10.0),
            (7.5, 10.0),
            (2.1, 2.5),
            (0.3, 0.5),
            (120.0, 200.0),
            (1.0, 1.0),
        ] {
            assert!((nice_step(x) - want).abs() < 1e-9, "{x}: {}", nice_step(x));
        }
    }
}
