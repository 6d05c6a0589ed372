//! The virtio-mmio register block alone (no device thread): identity
//! registers, feature negotiation, the status state machine, queue setup,
//! interrupts, config space, and each bad write's exact error.

use softiommu_virtio::net::{NetConfig, MAC_OFFSET, MTU_OFFSET};
use softiommu_virtio::spec::{self, feature, isr, reg, status};
use softiommu_virtio::transport::{DeviceEnd, DeviceError, MmioTransport, TransportConfig};

fn transport() -> MmioTransport {
    MmioTransport::new(
        NetConfig::default().device_info(),
        TransportConfig::default(),
    )
}

const GOOD: u64 = 1 << feature::VERSION_1 | 1 << feature::ACCESS_PLATFORM;

fn write_features(t: &MmioTransport, f: u64) {
    t.write(reg::DRIVER_FEATURES_SEL, 0);
    t.write(reg::DRIVER_FEATURES, f as u32);
    t.write(reg::DRIVER_FEATURES_SEL, 1);
    t.write(reg::DRIVER_FEATURES, (f >> 32) as u32);
}

/// Up to FEATURES_OK with `f`; returns the status read back.
fn negotiate(t: &MmioTransport, f: u64) -> u32 {
    t.write(reg::STATUS, status::ACKNOWLEDGE);
    t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    write_features(t, f);
    t.write(
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK,
    );
    t.read(reg::STATUS)
}

fn setup_queue(t: &MmioTransport, q: u32, size: u32, base: u64) {
    t.write(reg::QUEUE_SEL, q);
    t.write(reg::QUEUE_NUM, size);
    t.write(reg::QUEUE_DESC_LOW, base as u32);
    t.write(reg::QUEUE_DESC_HIGH, (base >> 32) as u32);
    t.write(reg::QUEUE_DRIVER_LOW, (base + 0x1000) as u32);
    t.write(reg::QUEUE_DRIVER_HIGH, 0);
    t.write(reg::QUEUE_DEVICE_LOW, (base + 0x2000) as u32);
    t.write(reg::QUEUE_DEVICE_HIGH, 0);
    t.write(reg::QUEUE_READY, 1);
}

#[test]
fn identity_registers_read_as_the_spec_says() {
    let t = transport();
    assert_eq!(t.read(reg::MAGIC_VALUE), 0x7472_6976);
    assert_eq!(t.read(reg::VERSION), 2);
    assert_eq!(t.read(reg::DEVICE_ID), 1);
    assert_eq!(t.read(reg::VENDOR_ID), spec::VENDOR_ID);
    t.write(reg::DEVICE_FEATURES_SEL, 1);
    let hi = t.read(reg::DEVICE_FEATURES);
    assert_eq!(hi & 0b11, 0b11, "VERSION_1 (32) and ACCESS_PLATFORM (33)");
    t.write(reg::DEVICE_FEATURES_SEL, 0);
    let lo = t.read(reg::DEVICE_FEATURES);
    assert_ne!(lo & 1 << feature::NET_MAC, 0);
    assert_ne!(lo & 1 << feature::NET_MTU, 0);
    t.write(reg::DEVICE_FEATURES_SEL, 7);
    assert_eq!(t.read(reg::DEVICE_FEATURES), 0);
    t.write(reg::QUEUE_SEL, 0);
    assert_eq!(t.read(reg::QUEUE_NUM_MAX), 256);
    t.write(reg::QUEUE_SEL, 2);
    assert_eq!(t.read(reg::QUEUE_NUM_MAX), 0, "only two queues");
    assert_eq!(t.read(reg::SHM_LEN_LOW), u32::MAX, "no shared memory");
    assert!(t.errors().snapshot().is_empty());
}

#[test]
fn config_space_holds_mac_and_mtu_and_refuses_writes() {
    let t = transport();
    let mut mac = [0u8; 6];
    t.read_config(MAC_OFFSET as u64, &mut mac);
    assert_eq!(mac, NetConfig::default().mac);
    let mtu = t.read(reg::CONFIG + MTU_OFFSET as u64) & 0xffff;
    assert_eq!(mtu, 1500);
    t.write(reg::CONFIG, 0xdead);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::ConfigWrite { offset: 0 }]
    ));
    let g = t.read(reg::CONFIG_GENERATION);
    t.update_config(&[2, 0, 0, 0, 0, 9]);
    assert_eq!(t.read(reg::CONFIG_GENERATION), g.wrapping_add(1));
    assert_eq!(
        t.read(reg::INTERRUPT_STATUS) & isr::CONFIG_CHANGE,
        isr::CONFIG_CHANGE
    );
    t.read_config(MAC_OFFSET as u64, &mut mac);
    assert_eq!(mac, [2, 0, 0, 0, 0, 9]);
    // A read wholly past the config space is recorded and reads zero.
    assert_eq!(t.read(reg::CONFIG + 0x80), 0);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::BadRegister {
            offset: 0x180,
            op: "read"
        }]
    ));
}

#[test]
fn features_are_accepted_only_with_version_1_and_access_platform() {
    let t = transport();
    assert_ne!(
        negotiate(&t, GOOD | 1 << feature::NET_MAC) & status::FEATURES_OK,
        0
    );
    assert!(t.errors().snapshot().is_empty());

    let t = transport();
    assert_eq!(
        negotiate(&t, 1 << feature::ACCESS_PLATFORM) & status::FEATURES_OK,
        0
    );
    let e = t.errors().drain();
    assert!(
        matches!(&e[..], [DeviceError::FeaturesRefused { reason, .. }] if reason.contains("VERSION_1")),
        "{e:?}"
    );

    let t = transport();
    assert_eq!(
        negotiate(&t, 1 << feature::VERSION_1) & status::FEATURES_OK,
        0
    );
    let e = t.errors().drain();
    assert!(
        matches!(&e[..], [DeviceError::FeaturesRefused { reason, .. }] if reason.contains("ACCESS_PLATFORM")),
        "{e:?}"
    );

    // A feature the device never offered (indirect descriptors).
    let t = transport();
    let f = GOOD | 1 << feature::RING_INDIRECT_DESC;
    assert_eq!(negotiate(&t, f) & status::FEATURES_OK, 0);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::FeaturesRefused { driver, reason: "a feature the device did not offer" }] if driver == f
    ));

    // With the requirement off, a driver that ignores ACCESS_PLATFORM is
    // accepted.
    let lax = MmioTransport::new(
        NetConfig::default().device_info(),
        TransportConfig {
            require_access_platform: false,
            ..TransportConfig::default()
        },
    );
    assert_ne!(
        negotiate(&lax, 1 << feature::VERSION_1) & status::FEATURES_OK,
        0
    );
}

#[test]
fn driver_features_after_features_ok_are_refused() {
    let t = transport();
    negotiate(&t, GOOD);
    t.write(reg::DRIVER_FEATURES, 0xffff_ffff);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::LateWrite {
            offset: reg::DRIVER_FEATURES,
            ..
        }]
    ));
}

#[test]
fn status_bits_cannot_be_cleared_and_driver_ok_needs_features_ok() {
    let t = transport();
    t.write(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    t.write(reg::STATUS, status::ACKNOWLEDGE);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::StatusBitCleared {
            cleared: status::DRIVER
        }]
    ));
    assert_eq!(t.read(reg::STATUS), status::ACKNOWLEDGE | status::DRIVER);

    t.write(
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::DRIVER_OK,
    );
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::DriverOkBeforeFeaturesOk { .. }]
    ));
    let st = t.read(reg::STATUS);
    assert_eq!(st & status::DRIVER_OK, 0);
    assert_ne!(st & status::DEVICE_NEEDS_RESET, 0);
    assert_ne!(t.read(reg::INTERRUPT_STATUS) & isr::CONFIG_CHANGE, 0);
}

#[test]
fn a_queue_size_that_is_not_a_power_of_two_is_refused() {
    let t = transport();
    negotiate(&t, GOOD);
    t.write(reg::QUEUE_SEL, 0);
    t.write(reg::QUEUE_NUM, 100);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::QueueSizeInvalid {
            queue: 0,
            size: 100,
            max: 256
        }]
    ));
    assert_ne!(t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    // Stopped until a reset: nothing more is set up.
    t.write(reg::QUEUE_NUM, 64);
    t.write(reg::QUEUE_READY, 1);
    assert!(matches!(
        t.errors().drain()[..],
        [
            DeviceError::LateWrite {
                offset: reg::QUEUE_NUM,
                ..
            },
            DeviceError::LateWrite {
                offset: reg::QUEUE_READY,
                ..
            }
        ]
    ));
    assert_eq!(t.read(reg::QUEUE_READY), 0);
    // After a reset: nor can it be made ready without a size.
    t.write(reg::STATUS, 0);
    negotiate(&t, GOOD);
    t.write(reg::QUEUE_SEL, 0);
    t.write(reg::QUEUE_READY, 1);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::QueueLayoutInvalid {
            queue: 0,
            what: "size",
            ..
        }]
    ));
    assert_eq!(t.read(reg::QUEUE_READY), 0);
    // Too large, and zero, each on a fresh initialisation.
    for size in [512, 0] {
        t.write(reg::STATUS, 0);
        negotiate(&t, GOOD);
        t.write(reg::QUEUE_SEL, 0);
        t.write(reg::QUEUE_NUM, size);
        assert!(
            matches!(
                t.errors().drain()[..],
                [DeviceError::QueueSizeInvalid { size: s, .. }] if s == size
            ),
            "{size}"
        );
    }
}

/// A queue is set up only after `FEATURES_OK` and while neither `FAILED`
/// nor `DEVICE_NEEDS_RESET` is set (§3.1.1, §2.1.1); `DRIVER_OK` after
/// `FAILED` makes nothing live. (Before: a queue made ready at status 0
/// went live with `DRIVER_OK`, and one set up again under
/// `DEVICE_NEEDS_RESET` was served.)
#[test]
fn queues_are_set_up_only_between_features_ok_and_a_failure() {
    let t = transport();
    t.write(reg::QUEUE_SEL, 0);
    t.write(reg::QUEUE_NUM, 64);
    t.write(reg::QUEUE_READY, 1);
    assert!(matches!(
        t.errors().drain()[..],
        [
            DeviceError::LateWrite {
                offset: reg::QUEUE_NUM,
                status: 0
            },
            DeviceError::LateWrite {
                offset: reg::QUEUE_READY,
                status: 0
            }
        ]
    ));
    assert_eq!(t.read(reg::QUEUE_READY), 0);
    negotiate(&t, GOOD);
    t.write(reg::STATUS, t.read(reg::STATUS) | status::FAILED);
    t.write(reg::STATUS, t.read(reg::STATUS) | status::DRIVER_OK);
    assert_eq!(t.read(reg::STATUS) & status::DRIVER_OK, 0);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::LateWrite {
            offset: reg::STATUS,
            ..
        }]
    ));
}

#[test]
fn misaligned_rings_are_refused() {
    let t = transport();
    negotiate(&t, GOOD);
    t.write(reg::QUEUE_SEL, 1);
    t.write(reg::QUEUE_NUM, 64);
    t.write(reg::QUEUE_DESC_LOW, 0x1008);
    t.write(reg::QUEUE_READY, 1);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::QueueLayoutInvalid {
            queue: 1,
            what: "descriptor table",
            addr: 0x1008,
            align: 16
        }]
    ));
    assert_eq!(t.read(reg::QUEUE_READY), 0);
}

#[test]
fn queue_layout_cannot_change_while_ready_nor_name_a_missing_queue() {
    let t = transport();
    negotiate(&t, GOOD);
    setup_queue(&t, 0, 16, 0x10_0000);
    assert_eq!(t.read(reg::QUEUE_READY), 1);
    t.write(reg::QUEUE_NUM, 32);
    t.write(reg::QUEUE_SEL, 5);
    t.write(reg::QUEUE_NUM, 32);
    assert!(matches!(
        t.errors().drain()[..],
        [
            DeviceError::LateWrite {
                offset: reg::QUEUE_NUM,
                ..
            },
            DeviceError::NoSuchQueue {
                queue: 5,
                queues: 2
            }
        ]
    ));
}

#[test]
fn a_notification_before_driver_ok_is_an_error_that_needs_reset() {
    let t = transport();
    negotiate(&t, GOOD);
    setup_queue(&t, 1, 16, 0x10_0000);
    t.write(reg::QUEUE_NOTIFY, 1);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::NotifyBeforeDriverOk { queue: 1, .. }]
    ));
    assert_ne!(t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    assert_eq!(t.notifications(), 0);
}

/// A kick at status 0 (one that raced the device's reset) is recorded but
/// sets no `DEVICE_NEEDS_RESET`: the next initialisation sets its queues
/// up as usual (with the queue set-up held by that bit, the late kick
/// would otherwise leave the device unusable until another reset).
#[test]
fn a_kick_that_races_a_reset_does_not_break_the_next_initialisation() {
    let t = transport();
    t.write(reg::STATUS, 0);
    t.write(reg::QUEUE_NOTIFY, 1);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::LateWrite {
            offset: reg::QUEUE_NOTIFY,
            status: 0
        }]
    ));
    assert_eq!(t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET, 0);
    negotiate(&t, GOOD);
    setup_queue(&t, 1, 16, 0x10_0000);
    assert!(t.errors().drain().is_empty());
    assert_eq!(t.read(reg::QUEUE_READY), 1);
}

#[test]
fn driver_ok_makes_ready_queues_live_and_reset_clears_everything() {
    let t = transport();
    let end = DeviceEnd::new(&t);
    negotiate(&t, GOOD);
    setup_queue(&t, 0, 16, 0x10_0000);
    setup_queue(&t, 1, 32, 0x20_0000);
    assert_eq!(end.live_mask(), 0, "not before DRIVER_OK");
    t.write(
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
    );
    {
        let q1 = end.queue(1).expect("queue 1 exists");
        let l1 = q1.as_ref().expect("live").layout();
        assert_eq!(
            (l1.size, l1.desc, l1.avail, l1.used),
            (32, 0x20_0000, 0x20_1000, 0x20_2000)
        );
    }
    assert_eq!(end.live_mask(), 0b11);
    assert_eq!(end.features(), GOOD);
    assert!(end.queue(2).is_none(), "no third queue");
    assert!(end.is_live());
    // A notification reaches the device's bitmap; a bad one is recorded.
    t.write(reg::QUEUE_NOTIFY, 1);
    assert_eq!(end.take_notified(), 0b10);
    assert_eq!(end.take_notified(), 0);
    t.write(reg::QUEUE_NOTIFY, 9);
    assert!(matches!(
        t.errors().drain()[..],
        [DeviceError::NoSuchQueue { queue: 9, .. }]
    ));
    // Interrupts: set by the device, cleared by InterruptACK.
    end.used_interrupt();
    assert_eq!(t.read(reg::INTERRUPT_STATUS), isr::USED_BUFFER);
    t.write(reg::INTERRUPT_ACK, isr::USED_BUFFER);
    assert_eq!(t.read(reg::INTERRUPT_STATUS), 0);
    // Reset.
    end.used_interrupt();
    t.write(reg::STATUS, 0);
    assert_eq!(t.read(reg::STATUS), 0);
    assert_eq!(t.read(reg::INTERRUPT_STATUS), 0);
    t.write(reg::QUEUE_SEL, 1);
    assert_eq!(t.read(reg::QUEUE_READY), 0);
    assert_eq!(end.live_mask(), 0);
    assert_eq!(end.features(), 0);
    assert!(!end.is_live());
    assert!(t.errors().drain().is_empty());
}

#[test]
fn unknown_registers_are_recorded_and_ignored() {
    let t = transport();
    assert_eq!(t.read(0x18), 0);
    t.write(0x04, 7);
    t.write(reg::MAGIC_VALUE, 1);
    assert!(matches!(
        t.errors().drain()[..],
        [
            DeviceError::BadRegister {
                offset: 0x18,
                op: "read"
            },
            DeviceError::BadRegister {
                offset: 0x04,
                op: "write"
            },
            DeviceError::BadRegister {
                offset: 0,
                op: "write"
            }
        ]
    ));
    assert_eq!(t.read(reg::MAGIC_VALUE), 0x7472_6976);
    assert_eq!(
        t.read(reg::STATUS) & status::DEVICE_NEEDS_RESET,
        0,
        "harmless"
    );
}

#[test]
fn notifications_and_interrupts_are_routed_per_queue() {
    let t = transport();
    let end = DeviceEnd::new(&t);
    negotiate(&t, GOOD);
    setup_queue(&t, 0, 16, 0x10_0000);
    setup_queue(&t, 1, 16, 0x20_0000);
    t.write(
        reg::STATUS,
        status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
    );
    // A thread serving queue 1 takes only its own notifications.
    t.write(reg::QUEUE_NOTIFY, 0);
    t.write(reg::QUEUE_NOTIFY, 1);
    assert_eq!(end.take_notified_in(0b10), 0b10);
    assert_eq!(end.take_notified_in(0b10), 0);
    assert_eq!(end.take_notified(), 0b01);
    // A queue's first registration counts.
    let e2 = end.clone();
    let got = std::thread::spawn(move || e2.register_queues(0b10))
        .join()
        .unwrap();
    assert_eq!(got, 0b10);
    assert_eq!(end.register_queues(0b11), 0b01);
    // A queue's used-buffer interrupt goes to the thread bound to it.
    assert!(t.bind_queue_interrupt(1, std::thread::current()));
    assert!(!t.bind_queue_interrupt(9, std::thread::current()));
    let before = t.interrupts_raised();
    end.queue_interrupt(1);
    assert_eq!(t.interrupts_raised(), before + 1);
    assert_eq!(t.read(reg::INTERRUPT_STATUS), isr::USED_BUFFER);
    // Woken: the park returns at once (the unpark token is set).
    std::thread::park_timeout(std::time::Duration::from_secs(5));
    assert!(t.errors().drain().is_empty());
}
