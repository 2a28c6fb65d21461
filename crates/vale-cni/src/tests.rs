use super::*;

#[test]
fn ipam_results_of_every_version_are_read() {
    let r = json!({
        "cniVersion": "0.4.0",
        "ips": [
            {"version": "4", "address": "10.1.0.5/24", "gateway": "10.1.0.1"},
            {"address": "fd00::5/64"}
        ],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.2.0.0/16", "gw": "10.1.0.254"}]
    });
    let (ips, routes) = addressing(&r).unwrap();
    assert_eq!(
        ips,
        vec![
            Ip {
                addr: "10.1.0.5".parse().unwrap(),
                prefix: 24,
                gateway: Some("10.1.0.1".parse().unwrap())
            },
            Ip {
                addr: "fd00::5".parse().unwrap(),
                prefix: 64,
                gateway: None
            },
        ]
    );
    assert_eq!(
        routes[0],
        Route {
            dst: "0.0.0.0".parse().unwrap(),
            prefix: 0,
            gw: None
        }
    );
    assert_eq!(routes[1].gw, Some("10.1.0.254".parse().unwrap()));
    assert_eq!(addressing(&json!({})).unwrap(), (vec![], vec![]));
    for bad in [
        json!({"ips": [{"address": "10.1.0.5"}]}),
        json!({"ips": [{"address": "10.1.0.5/33"}]}),
        json!({"ips": [{"address": "10.1.0.5/24", "gateway": "x"}]}),
        json!({"routes": [{"dst": "default"}]}),
    ] {
        assert_eq!(
            addressing(&bad).unwrap_err().code,
            error::DECODE_FAILURE,
            "{bad}"
        );
    }
}
