//! Errors as people read them: a top error and its causes on one line. A leaf: it imports
//! nothing of the crate, and every module may use it.

/// `e` and each of its causes, joined by ": " (a driver's top error, as "db error", alone does
/// not say what failed).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_msg = c.to_string();
        if !msg.ends_with(&c_msg) {
            msg.push_str(": ");
            msg.push_str(&c_msg);
        }
        cause = c.source();
    }
    msg
}
