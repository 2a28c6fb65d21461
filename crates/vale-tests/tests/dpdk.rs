//! DPDK's testpmd on vale's vhost-user ports: its `net_virtio_user` driver is a real vhost-user
//! front end (no VM), so vale's device side meets DPDK's virtio driver at full rate. Both
//! socket roles: valed listening (virtio_user `path=`) and valed connecting to a testpmd that
//! listens (virtio_user `server=1`).
//!
//! Every frame is accounted for, with no rate threshold: what testpmd's driver says it queued
//! or took, what valed counts for the vhost-user port and for the native ports, and what
//! vale-pktgen counted must add up exactly, each difference being a named drop counter. The
//! harness ([`vale_tests::dpdk::Front`]) is the memif tests' too.
//!
//! Needs root and testpmd with its virtio_user driver (`scripts/test.sh` installs dpdk-dev);
//! skipped, saying why, where they are missing outside CI. The tests of this file run one at a
//! time: a testpmd busy-polls a CPU.

use vale_tests::dpdk::{both_ways, killed_then_replaced, Attach, Names};

/// vale0:vm1, testpmd's virtio_user port; vale-pktgen's sinks.
const NAMES: Names = Names {
    port: "vale0:vm1",
    mac: "02:00:00:00:d0:01",
    mac_b: "02:00:00:00:d0:0b",
    mac_d: "02:00:00:00:d0:0d",
};

#[test]
fn testpmd_both_ways_valed_listening() {
    both_ways(Attach::VhostUserListening, NAMES, 1);
}

#[test]
fn testpmd_both_ways_valed_connecting() {
    both_ways(Attach::VhostUserConnecting, NAMES, 1);
}

#[test]
fn testpmd_killed_then_replaced_valed_listening() {
    killed_then_replaced(Attach::VhostUserListening, NAMES);
}

#[test]
fn testpmd_killed_then_replaced_valed_connecting() {
    killed_then_replaced(Attach::VhostUserConnecting, NAMES);
}
