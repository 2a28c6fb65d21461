//! The shortest path through vale: two ports, frames from one to the other.

use std::time::Duration;
use vale_tests::*;

#[test]
fn frames_cross_a_switch_byte_for_byte() {
    let v = Valed::start();
    let a = v.open("vale0:a");
    let b = v.open("vale0:b");
    for seq in 0..100u64 {
        let f = test_frame(60 + seq as usize, MAC_A, MAC_B, seq);
        assert!(send_frame(&a, &f));
        a.txsync(0).unwrap();
        let got = wait_frames(&b, Duration::from_secs(5));
        assert_eq!(got, vec![f], "frame {seq}");
    }
    let info = v.port("vale0:a").unwrap();
    assert_eq!(info.counters.tx_packets, 100);
    assert_eq!(v.port("vale0:b").unwrap().counters.rx_packets, 100);
}
