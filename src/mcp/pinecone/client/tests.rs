use super::*;

#[test]
fn hosts_get_https_and_plain_http_only_on_loopback() {
    for (given, base) in [
        ("http://127.0.0.1:9/", "http://127.0.0.1:9"),
        ("http://localhost:9", "http://localhost:9"),
        ("http://[::1]:9", "http://[::1]:9"),
        ("idx-1.svc.pinecone.io", "https://idx-1.svc.pinecone.io"),
        ("https://api.pinecone.io", "https://api.pinecone.io"),
    ] {
        assert_eq!(base_url(given).unwrap(), base, "{given}");
    }
    for bad in [
        "http://idx-1.svc.pinecone.io",
        "http://10.0.0.1:80",
        "ftp://x.example",
        "https://user:pw@x.example",
        "https://x.example/?q=1",
        "",
    ] {
        assert!(base_url(bad).is_err(), "{bad}");
    }
}

#[test]
fn namespaces_that_change_the_path_are_refused() {
    for bad in ["", ".", "..", "a/b", "/", "../x"] {
        assert!(check_namespace(bad).is_err(), "{bad:?}");
    }
    for good in ["wg21-papers", "a.b", "...", "a b", "_mcp_config"] {
        assert!(check_namespace(good).is_ok(), "{good:?}");
    }
}

#[test]
fn origins_compare_scheme_host_and_port() {
    let u = |s: &str| url::Url::parse(s).unwrap();
    assert!(same_origin(&u("https://a.io/x"), &u("https://a.io:443/y")));
    assert!(!same_origin(&u("https://a.io/x"), &u("http://a.io/x")));
    assert!(!same_origin(&u("https://a.io/x"), &u("https://b.io/x")));
    assert!(!same_origin(
        &u("http://127.0.0.1:1/"),
        &u("http://127.0.0.1:2/")
    ));
}

#[test]
fn namespaces_are_encoded_as_one_segment() {
    assert_eq!(path_segment("a b/c"), "a%20b%2Fc");
}

#[test]
fn error_messages_come_from_either_envelope() {
    assert_eq!(
        error_message(br#"{"error":{"code":"X","message":"m1"},"status":400}"#),
        "m1"
    );
    assert_eq!(error_message(br#"{"code":3,"message":"m2"}"#), "m2");
    assert_eq!(error_message(b"plain"), "plain");
}
