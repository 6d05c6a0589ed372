//! The back-end binary refuses bad arguments in one line with exit 2.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_softiommu-vhost-user-blk"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    let dir = std::env::temp_dir().join(format!("softiommu-vhost-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let odd = dir.join("odd.img");
    std::fs::write(&odd, [0u8; 100]).unwrap();
    let good = dir.join("good.img");
    std::fs::write(&good, [0u8; 512]).unwrap();
    let sock = dir.join("s.sock");
    let (s, g, o) = (
        sock.to_str().unwrap(),
        good.to_str().unwrap(),
        odd.to_str().unwrap(),
    );
    for (args, needle) in [
        (vec!["--file", g], "--socket is required"),
        (vec!["--socket", s], "--file is required"),
        (
            vec!["--socket", s, "--file", g, "--miss-timeout-ms", "0"],
            "--miss-timeout-ms must be in 1..=60000",
        ),
        (
            vec!["--socket", s, "--file", g, "--iotlb-entries", "x"],
            "--iotlb-entries must be in",
        ),
        (
            vec!["--socket", s, "--file", g, "--bogus"],
            "unknown argument",
        ),
        (
            vec!["--socket", s, "--file", "/nonexistent/disk"],
            "disk /nonexistent/disk",
        ),
        (
            vec!["--socket", s, "--file", o],
            "is not a positive multiple of 512",
        ),
        (vec!["--socket", s, "--file"], "--file needs a value"),
    ] {
        let (code, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
