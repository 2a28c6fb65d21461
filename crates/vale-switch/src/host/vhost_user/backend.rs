//! The vhost-user-backend seam: what the library's threads call on a message or an event.

use super::*;

impl VhostUserBackend for Net {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        self.queues()
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        // QEMU's vhost-user net needs protocol features (it enables rings with them); see
        // `relay` for what it gets wrong about them.
        NET_FEATURES
            .iter()
            .fold(1 << VIRTIO_F_VERSION_1, |f, &bit| f | 1 << bit)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        self.acked(features);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // REPLY_ACK the library adds itself; the relay answers GET_QUEUE_NUM,
        // GET_MAX_MEM_SLOTS and NET_SET_MTU.
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::MTU
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // A worker per queue pair.
        (0..self.0.pairs.len()).map(|p| 0b11 << rxq(p)).collect()
    }

    fn set_event_idx(&self, _enabled: bool) {}

    fn update_memory(&self, _mem: Mem) -> io::Result<()> {
        // The library replaced the table inside `self.0.mem`, the same atomic.
        self.guard_memory()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) = new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()?;
        // The library (0.24) registers the consumer in its epoll set through `into_raw_fd` and
        // never closes it: one descriptor per connection, which a front end that connects
        // and leaves in a loop would turn into valed running out of them. Closed once the
        // library's threads are gone (see `close_forgotten`).
        lock(&self.0.forgotten).push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        // Worker `thread_id` serves pair `thread_id`: `vrings` are its receive and transmit
        // queues.
        let p = thread_id;
        let (Some(pair), [rx, tx]) = (self.0.pairs.get(p), vrings) else {
            return Ok(());
        };
        if device_event == self.ev_irq() {
            lock(&self.0.pairs[0].steps).drain_irq();
        } else if device_event == self.ev_timer() {
            eventfd::drain(&pair.timer);
            pair.pace.timer_fired();
        } else if device_event == self.ev_guest_timer() {
            eventfd::drain(&self.0.guest_timer);
        }
        let queues = pair.queues.get_or_init(|| [rx.clone(), tx.clone()]);
        self.pump(p, queues);
        if p == 0 {
            self.fire_deferred();
        }
        Ok(())
    }
}
