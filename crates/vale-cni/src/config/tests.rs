use super::*;
use crate::error::{DECODE_FAILURE, INCOMPATIBLE_VERSION, INVALID_CONFIG, INVALID_ENV};

fn conf(extra: &str) -> String {
    format!(r#"{{"cniVersion":"1.0.0","name":"net","type":"vale-cni","switch":"vale0"{extra}}}"#)
}

fn code_of(text: &str) -> (u32, String) {
    let e = parse(text.as_bytes()).expect_err(text);
    (e.code, e.msg)
}

#[test]
fn a_full_configuration_is_read() {
    let c = parse(
        conf(
            r#","runDir":"/run/v","mtu":9000,"knobs":{"moderation":50,"learn-limit":"8"},
            "ipam":{"type":"host-local","subnet":"10.1.0.0/24"},"dns":{"nameservers":["10.1.0.1"]},
            "runtimeConfig":{},"args":{}"#,
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(c.switch, "vale0");
    assert_eq!(c.run_dir, PathBuf::from("/run/v"));
    assert_eq!(c.mtu, Some(9000));
    assert_eq!(c.knobs["moderation"], "50");
    assert_eq!(c.knobs["learn-limit"], "8");
    assert_eq!(c.ipam.as_deref(), Some("host-local"));
    let d = parse(conf("").as_bytes()).unwrap();
    assert_eq!(d.run_dir, PathBuf::from("/run/vale"));
    assert_eq!((d.mtu, d.ipam), (None, None));
}

#[test]
fn bad_configurations_get_the_specs_codes() {
    // Not JSON at all: a decode failure.
    for text in ["", "{", "[1,2]", "nonsense"] {
        assert_eq!(code_of(text).0, DECODE_FAILURE, "{text}");
    }
    // A version this plugin does not speak, or none.
    for v in [r#""0.2.0""#, r#""2.0.0""#, r#""""#] {
        let text = conf("").replace(r#""1.0.0""#, v);
        let (code, msg) = code_of(&text);
        assert_eq!(code, INCOMPATIBLE_VERSION, "{text}");
        assert!(msg.contains("1.0.0"), "{msg}");
    }
    let no_version = r#"{"name":"net","type":"vale-cni","switch":"vale0"}"#;
    assert_eq!(code_of(no_version).0, INCOMPATIBLE_VERSION);
    // The VLAN knob is known and refused, naming its key and value.
    let (code, msg) = code_of(&conf(r#","vlan":10"#));
    assert_eq!(code, UNSUPPORTED_FIELD);
    assert!(msg.contains("'vlan': 10"), "{msg}");
    // Missing or wrong fields: invalid configuration, each named.
    for (extra, named) in [
        (r#","mtu":67"#, "'mtu' 67"),
        (r#","mtu":65522"#, "'mtu' 65522"),
        (r#","mtu":-1"#, "'mtu' -1"),
        (r#","mtu":"big""#, "mtu"),
        (r#","runDir":"run/vale""#, "'runDir'"),
        (r#","knobs":{"speed":1}"#, "'speed'"),
        (r#","knobs":{"moderation":[1]}"#, "'moderation'"),
        (r#","ipam":{}"#, ""),
        (r#","ipam":{"subnet":"10.0.0.0/8"}"#, "ipam.type"),
        (r#","ipam":{"type":"../bin/sh"}"#, "ipam.type"),
        (r#","ipam":"host-local""#, "'ipam'"),
    ] {
        let text = conf(extra);
        match parse(text.as_bytes()) {
            Ok(_) if named.is_empty() => {}
            Ok(c) => panic!("{text} accepted: {c:?}"),
            Err(e) => {
                assert_eq!(e.code, INVALID_CONFIG, "{text}: {e:?}");
                assert!(e.msg.contains(named), "{text}: {:?} lacks {named}", e.msg);
            }
        }
    }
    for (text, named) in [
        (conf("").replace(r#","switch":"vale0""#, ""), "'switch'"),
        (conf("").replace(r#""vale0""#, r#""br0""#), "'switch'"),
        (conf("").replace(r#""name":"net","#, ""), "'name'"),
        (conf("").replace(r#""type":"vale-cni","#, ""), "'type'"),
    ] {
        let (code, msg) = code_of(&text);
        assert_eq!(code, INVALID_CONFIG, "{text}");
        assert!(msg.contains(named), "{msg} lacks {named}");
    }
}

#[test]
fn errors_are_written_in_the_configurations_version() {
    assert_eq!(
        version_of(conf("").replace("1.0.0", "0.4.0").as_bytes()),
        "0.4.0"
    );
    assert_eq!(version_of(b"garbage"), "1.0.0");
    assert_eq!(
        version_of(conf("").replace("1.0.0", "9.9.9").as_bytes()),
        "1.0.0"
    );
    let e = CniError::new(7, "bad").to_json("0.4.0");
    assert_eq!(
        e,
        serde_json::json!({"cniVersion": "0.4.0", "code": 7, "msg": "bad"})
    );
    let e = CniError::new(5, "io").with_details("why").to_json("1.0.0");
    assert_eq!(e["details"], "why");
    assert!(at_least("1.0.0", "0.4.0") && at_least("0.4.0", "0.4.0"));
    assert!(!at_least("0.3.1", "0.4.0"));
}

fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn the_environment_is_checked() {
    let good = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc-1.2_3"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/usr/lib/cni"),
    ];
    let e = env(vars(&good)).unwrap();
    assert_eq!(e.command, Command::Add);
    assert_eq!(
        (e.ifname.as_str(), e.path.as_str()),
        ("eth0", "/usr/lib/cni")
    );
    // VERSION needs nothing else.
    assert_eq!(
        env(vars(&[("CNI_COMMAND", "VERSION")])).unwrap().command,
        Command::Version
    );
    // DEL may come without the namespace.
    let mut del = good;
    del[0] = ("CNI_COMMAND", "DEL");
    del[2] = ("CNI_NETNS", "");
    assert_eq!(env(vars(&del)).unwrap().netns, "");
    for (i, bad, named) in [
        (0, ("CNI_COMMAND", "FROB"), "FROB"),
        (0, ("CNI_COMMAND", ""), "CNI_COMMAND"),
        (1, ("CNI_CONTAINERID", ""), "CNI_CONTAINERID"),
        (1, ("CNI_CONTAINERID", "-x"), "CNI_CONTAINERID"),
        (1, ("CNI_CONTAINERID", "a/b"), "CNI_CONTAINERID"),
        (2, ("CNI_NETNS", ""), "CNI_NETNS"),
        (2, ("CNI_NETNS", "netns/x"), "CNI_NETNS"),
        (3, ("CNI_IFNAME", ""), "CNI_IFNAME"),
        (3, ("CNI_IFNAME", "a-name-too-long-"), "CNI_IFNAME"),
        (3, ("CNI_IFNAME", "a/b"), "CNI_IFNAME"),
        (3, ("CNI_IFNAME", ".."), "CNI_IFNAME"),
        (3, ("CNI_IFNAME", "a b"), "CNI_IFNAME"),
    ] {
        let mut v = good;
        v[i] = bad;
        let e = env(vars(&v)).expect_err(&format!("{bad:?}"));
        assert_eq!(e.code, INVALID_ENV, "{bad:?}");
        assert!(e.msg.contains(named), "{bad:?}: {}", e.msg);
    }
    let e = env(vars(&good[1..])).unwrap_err();
    assert_eq!(
        (e.code, e.msg.as_str()),
        (INVALID_ENV, "CNI_COMMAND is not set")
    );
}

#[test]
fn gc_reads_the_valid_attachments_and_needs_no_container() {
    let text = conf(r#","cni.dev/valid-attachments":[{"containerID":"a1","ifname":"eth0"}]"#)
        .replace("1.0.0", "1.1.0");
    let c = parse(text.as_bytes()).unwrap();
    assert_eq!(
        c.valid_attachments,
        vec![("a1".to_string(), "eth0".to_string())]
    );
    for bad in [
        r#","cni.dev/valid-attachments":{}"#,
        r#","cni.dev/valid-attachments":[{"containerID":"a1"}]"#,
    ] {
        let (code, msg) = code_of(&conf(bad));
        assert_eq!(code, INVALID_CONFIG, "{bad}");
        assert!(msg.contains("cni.dev/valid-attachments"), "{msg}");
    }
    for cmd in ["GC", "STATUS"] {
        let e = env(vars(&[("CNI_COMMAND", cmd), ("CNI_PATH", "/p")])).unwrap();
        assert_eq!(e.path, "/p");
    }
}
