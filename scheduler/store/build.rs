//! Marks the store suite's MySQL variants ignored, saying how to run them, when the build has no
//! MySQL server to test against: `AX_TEST_MYSQL_URL` unset outside CI. Under `CI=true` they
//! run and fail instead, as CI must run everything. Cargo builds again when either changes.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ax_test_without_mysql)");
    println!("cargo::rerun-if-env-changed=AX_TEST_MYSQL_URL");
    println!("cargo::rerun-if-env-changed=CI");
    let given = std::env::var_os("AX_TEST_MYSQL_URL").is_some_and(|url| !url.is_empty());
    let ci = std::env::var("CI").as_deref() == Ok("true");
    if !given && !ci {
        println!("cargo::rustc-cfg=ax_test_without_mysql");
    }
}
