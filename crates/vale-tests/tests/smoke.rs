//! The shortest path through vale: two ports, frames from one to the other.

use vale_tests::*;

#[test]
fn frames_cross_a_switch_byte_for_byte() {
    let v = Valed::start();
    let (a, b) = v.open_ab();
    one_at_a_time(&a, &b, 100);
    let info = v.port("vale0:a").unwrap();
    assert_eq!(info.counters.tx_packets, 100);
    assert_eq!(v.port("vale0:b").unwrap().counters.rx_packets, 100);
}
