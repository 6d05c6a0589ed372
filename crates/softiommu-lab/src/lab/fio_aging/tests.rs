use super::run::failed_work;
use crate::metrics::aging::AgingSummary;

#[test]
fn a_run_with_failed_or_wrong_io_is_invalid_and_says_why() {
    assert_eq!(failed_work(0, 0), None);
    let why = failed_work(976_096, 0).unwrap();
    assert!(why.starts_with("976096 I/O error(s): "), "{why}");
    let why = failed_work(1, 2).unwrap();
    assert!(why.ends_with("; 2 read(s) returned wrong data"), "{why}");
    let a = AgingSummary::absent();
    assert!(a.retained.is_nan() && !a.settled);
    assert_eq!(
        serde_json::to_value(a).unwrap()["retained"],
        serde_json::Value::Null
    );
}
