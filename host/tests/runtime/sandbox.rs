use std::time::{Duration, Instant};

use super::*;
use sluice::runtime::{Domain, Error};

#[test]
fn a_trap_is_an_error_and_the_host_carries_on() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    let err = instance.process(&batch(&["trap"])).expect_err("trap");
    assert!(matches!(err, Error::Trap(_)), "{err:?}");
    assert!(
        err.to_string().contains("the probe was asked to trap") || err.to_string().contains("unreachable"),
        "{err}"
    );
    assert_eq!(err.domain(), Domain::Guest);
    // The failed instance refuses further calls instead of running on a
    // half-updated heap ...
    assert!(matches!(instance.process(&batch(&["get a"])), Err(Error::Poisoned)));
    // ... and a fresh one works.
    let mut fresh = probe(&runtime, InstanceLimits::default());
    assert_eq!(values(&fresh.process(&batch(&["get a"])).expect("fresh instance")), ["<none>"]);
}

#[test]
fn an_infinite_loop_is_interrupted_at_its_deadline() {
    let (runtime, _cache) = runtime();
    let deadline = Duration::from_millis(200);
    let mut instance = probe(&runtime, InstanceLimits { deadline, ..InstanceLimits::default() });
    let started = Instant::now();
    let err = instance.process(&batch(&["spin"])).expect_err("interrupted");
    eprintln!("interrupted after {:?} (deadline {deadline:?})", started.elapsed());
    assert!(matches!(err, Error::Deadline(d) if d == deadline), "{err:?}");
    assert!(err.to_string().contains("deadline"), "{err}");
}

#[test]
fn a_memory_bomb_hits_the_limit() {
    let (runtime, _cache) = runtime();
    let limit = 32 << 20;
    let mut instance = probe(&runtime, InstanceLimits { memory_bytes: limit, ..InstanceLimits::default() });
    let err = instance.process(&batch(&["alloc"])).expect_err("limit");
    match err {
        Error::MemoryLimit { limit: l, requested } => {
            assert_eq!(l, limit);
            assert!(requested > limit);
        }
        other => panic!("expected a memory limit error, got {other:?}"),
    }
}

#[test]
fn too_many_outputs_per_input_is_a_limit_error() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits { max_outputs_per_input: 10, ..InstanceLimits::default() });
    assert_eq!(instance.process(&batch(&["emit 10"])).expect("at the limit").len(), 10);
    let err = instance.process(&batch(&["emit 11"])).expect_err("over the limit");
    assert!(matches!(err, Error::Limit(_)), "{err:?}");
    assert!(err.to_string().contains("11 output records for a batch of 1"), "{err}");
}

#[test]
fn an_error_returned_by_the_guest_carries_its_message() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    let err = instance.process(&batch(&["fail"])).expect_err("fails");
    assert!(matches!(&err, Error::Guest(m) if m == "the probe was asked to fail"), "{err:?}");
}

#[test]
fn an_init_error_carries_its_message() {
    let (runtime, _cache) = runtime();
    let module = load(&runtime, "probe");
    let mut instance =
        runtime.instantiate(&module, "t", TaskState::in_memory(), InstanceLimits::default()).expect("instantiate");
    let err = instance.init(&[("fail-init".into(), "yes".into())]).expect_err("init fails");
    assert!(err.to_string().contains("init failed because the config asked it to"), "{err}");
}

#[test]
fn logging_and_stdout_do_not_disturb_the_batch() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    let outputs = instance.process(&batch(&["log hello from the guest", "set a 1", "get a"])).expect("process");
    assert_eq!(values(&outputs), ["ok", "ok", "1"]);
}

#[test]
fn a_memory_limit_above_the_host_ceiling_is_refused() {
    let (runtime, _cache) = runtime();
    let module = load(&runtime, "probe");
    let limits = InstanceLimits { memory_bytes: usize::MAX, ..InstanceLimits::default() };
    let err = runtime.instantiate(&module, "t", TaskState::in_memory(), limits).err().expect("refused");
    assert!(err.to_string().contains("ceiling"), "{err}");
}
