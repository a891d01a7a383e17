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

/// The host keeps a guest's error in many places (poison suspects, the
/// task's history, the job's log): it keeps at most 4 KiB of it.
#[test]
fn a_huge_error_from_the_guest_is_cut() {
    let (runtime, _cache) = runtime();
    let mut instance = probe(&runtime, InstanceLimits::default());
    let err = instance.process(&batch(&["failbig 1000000"])).expect_err("fails");
    let Error::Guest(message) = &err else { panic!("{err:?}") };
    assert!(message.len() <= sluice::runtime::MAX_GUEST_ERROR + 64, "{} bytes kept", message.len());
    assert!(message.ends_with(&format!("({} more bytes cut)", 1_000_000 - sluice::runtime::MAX_GUEST_ERROR)));
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

#[test]
fn a_guest_asleep_in_a_host_call_does_not_outlive_its_deadline() {
    let (runtime, _cache) = runtime();
    let limits = InstanceLimits { deadline: Duration::from_millis(200), ..InstanceLimits::default() };
    let module = load(&runtime, "probe");
    let runtime = std::sync::Arc::new(runtime);
    let (done, result) = std::sync::mpsc::channel();
    // Not a scoped thread: if the sleep is real, the test must fail, not
    // wait for it.
    let sleeper = std::sync::Arc::clone(&runtime);
    std::thread::spawn(move || {
        let mut instance =
            sleeper.instantiate(&module, "test/sleeper", TaskState::in_memory(), limits).expect("instantiates");
        instance.init(&[]).expect("init");
        // An hour of sleep under a 200 ms deadline.
        let _ = done.send(instance.process(&batch(&["sleep 3600000"])).map(|o| values(&o)));
    });
    // A liveness bound, not a timing claim: a real sleep would hold the task
    // (and its stop, upgrade, the host's shutdown) for an hour.
    let outcome = result
        .recv_timeout(Duration::from_secs(60))
        .expect("the guest is still asleep inside a host call a minute later");
    // The guest's clock is virtual: the hour passed for it, not for us.
    assert_eq!(outcome.expect("the sleep returns"), ["slept 3600000ms"]);
}

#[test]
fn get_many_is_bounded_by_what_the_guest_could_hold_before_the_host_allocates() {
    let (runtime, _cache) = runtime();
    let limit = 32 << 20;
    let mut instance = probe(&runtime, InstanceLimits { memory_bytes: limit, ..InstanceLimits::default() });
    instance.process(&batch(&["fill big 2097152"])).expect("a 2 MiB value");
    assert_eq!(values(&instance.process(&batch(&["getsame big 4"])).expect("8 MiB fits")), ["8388608"]);
    // 1,000 copies would be 2 GiB in host memory before lowering.
    let err = instance.process(&batch(&["getsame big 1000"])).expect_err("over the guest's memory");
    assert!(matches!(err, Error::Limit(_)), "{err:?}");
    assert!(err.to_string().contains("get-many of 1000 keys would return more than"), "{err}");
}

/// A guest that hands the host one region many times over (a list whose
/// elements all point at it) is refused once the host would copy more than
/// the guest's memory limit in one call, before it copies: what a guest
/// costs the host stays its limit, not the region times the count.
#[test]
fn aliased_lists_are_refused_before_the_host_copies_them() {
    let (runtime, _cache) = runtime();
    let limits = InstanceLimits { memory_bytes: 16 << 20, ..InstanceLimits::default() };
    // 64 keys of 64 KiB, 4 MiB in all: within the limit.
    let mut instance = probe(&runtime, limits);
    assert_eq!(values(&instance.process(&batch(&["aliasget 64 65536"])).expect("4 MiB")), ["0"]);
    assert_eq!(values(&instance.process(&batch(&["aliaswrite 4 1048576"])).expect("4 MiB")), ["ok"]);
    // 32 MiB each, out of one region of 64 KiB or 2 MiB.
    for command in ["aliasget 512 65536", "aliaswrite 16 2097152"] {
        let err = probe(&runtime, limits).process(&batch(&[command])).expect_err(command);
        assert!(matches!(err, Error::Limit(_)), "{command}: {err:?}");
        assert!(err.to_string().contains("more than 16777216 bytes in one call"), "{command}: {err}");
    }
}

#[test]
fn keys_values_and_deletes_are_bounded_and_charged() {
    let (runtime, _cache) = runtime();
    let limits = InstanceLimits { memory_bytes: 2 << 20, ..InstanceLimits::default() };
    let err = probe(&runtime, limits).process(&batch(&["bigkey 70000"])).expect_err("a 70 kB key");
    assert!(matches!(err, Error::Limit(_)) && err.to_string().contains("key of 70000 bytes"), "{err:?}");
    let roomy = InstanceLimits { memory_bytes: 64 << 20, ..limits };
    let err = probe(&runtime, roomy).process(&batch(&["fill v 17000000"])).expect_err("a 17 MB value");
    assert!(matches!(err, Error::Limit(_)) && err.to_string().contains("value of 17000000 bytes"), "{err:?}");
    // Deleting keys that do not exist still costs the host memory until the
    // checkpoint: 100,000 tombstones are over a 2 MiB memory limit.
    let mut instance = probe(&runtime, limits);
    instance.process(&batch(&["delmany 1000"])).expect("a few tombstones");
    let err = instance.process(&batch(&["delmany 100000"])).expect_err("too many tombstones");
    assert!(matches!(err, Error::Limit(_)), "{err:?}");
    assert!(err.to_string().contains("writes since the last checkpoint"), "{err}");
}

/// With a changelog, every entry must fit one Kafka record: a bigger write
/// fails the guest's call (its batch, which the job's error policy deals
/// with) instead of failing every checkpoint after it.
#[test]
fn an_entry_over_one_changelog_record_is_refused_at_the_write() {
    let (runtime, _cache) = runtime();
    let module = load(&runtime, "probe");
    let mut state = TaskState::in_memory();
    state.limit_entry(1_000_000);
    let limits = InstanceLimits { memory_bytes: 8 << 20, ..InstanceLimits::default() };
    let mut instance = runtime.instantiate(&module, "test/probe", state, limits).expect("instantiates");
    instance.init(&[]).expect("init");
    instance.process(&batch(&["fill small 999000"])).expect("a value that fits");
    let err = instance.process(&batch(&["fill big 1000000"])).expect_err("a value over one record");
    assert!(matches!(err, Error::Limit(_)), "{err:?}");
    assert!(err.to_string().contains("over the 1000000 bytes one changelog record holds"), "{err}");
}

/// What a guest returns as `packed-outputs` (world `packed-out`) is read
/// with the same care as anything else it hands the host: a well-formed
/// string gives its records; a malformed one fails the batch as the guest's
/// error, naming what is wrong; a count over the outputs limit is refused
/// before the host allocates for it, as a list over it is.
#[test]
fn packed_outputs_from_a_guest_are_checked_before_they_are_read() {
    let (runtime, _cache) = runtime();
    let module = load(&runtime, "packed-echo");
    assert_eq!(module.world(), "packed-out");
    let limits = InstanceLimits { max_outputs_per_input: 10, ..InstanceLimits::default() };
    let echo = || {
        let mut instance =
            runtime.instantiate(&module, "test/packed-echo", TaskState::in_memory(), limits).expect("instantiates");
        instance.init(&[]).expect("init");
        instance
    };
    let returning = |packed: Vec<u8>| InputRecord { value: Some(packed), ..record("", 0) };
    let part = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    };

    let mut two = 2u32.to_le_bytes().to_vec();
    two.push(1 | 2);
    part(&mut two, b"k");
    part(&mut two, b"v");
    two.extend_from_slice(&0u32.to_le_bytes());
    two.push(4);
    part(&mut two, b"elsewhere");
    two.extend_from_slice(&0u32.to_le_bytes());
    let outputs = echo().process(&[returning(two.clone())]).expect("well formed");
    assert_eq!(outputs.len(), 2);
    assert_eq!((outputs[0].key.as_deref(), outputs[0].value.as_deref()), (Some(&b"k"[..]), Some(&b"v"[..])));
    assert_eq!((outputs[1].topic.as_deref(), outputs[1].value.as_ref()), (Some("elsewhere"), None));

    let mut instance = echo();
    let err = instance.process(&[returning(two[..two.len() - 1].to_vec())]).expect_err("cut short");
    assert!(matches!(err, Error::Guest(_)), "{err:?}");
    assert_eq!(err.domain(), Domain::Guest);
    assert!(
        err.to_string()
            .contains("process-packed-out returned malformed packed-outputs: 4 bytes wanted at byte 33 of 36"),
        "{err}"
    );
    assert!(matches!(instance.process(&[returning(two)]), Err(Error::Poisoned)));

    // Four billion records claimed in four bytes, and eleven for one input.
    for count in [u32::MAX, 11] {
        let err = echo().process(&[returning(count.to_le_bytes().to_vec())]).expect_err("over the limit");
        assert!(matches!(err, Error::Limit(_)), "{err:?}");
        assert!(err.to_string().contains(&format!("{count} output records for a batch of 1")), "{err}");
    }
}

/// Pins the calling thread to CPU `core`.
fn pin_to(core: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, and the call only
    // reads it.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0, "pinning a thread");
    }
}

/// The thread's CPU time.
fn thread_cpu() -> Duration {
    cpu_time::ThreadTime::now().as_duration()
}

/// A call's deadline is CPU time: a call that gets a sixth of a core (five
/// other threads spin on its core) takes several times its CPU time
/// in wall time, past its deadline, and is not interrupted, as another
/// tenant's load must not fail a guest. (Before, the deadline was wall
/// time, and the call was interrupted.) A call that uses its CPU time still
/// is.
#[test]
fn the_deadline_counts_the_calls_cpu_time_not_its_wait_for_a_core() {
    let (runtime, _cache) = runtime();
    let pinned = std::thread::spawn(move || {
        pin_to(0);
        // How many rounds take about 80 ms of CPU here, alone.
        let mut calibrating =
            probe(&runtime, InstanceLimits { deadline: Duration::from_secs(30), ..Default::default() });
        let before = thread_cpu();
        calibrating.process(&batch(&["busy 20"])).expect("calibration");
        let per_round = (thread_cpu() - before).as_secs_f64() / 20.0;
        let rounds = ((0.08 / per_round).ceil() as u64).max(1);
        // A deadline of three times that CPU time, under five spinning threads.
        let deadline = Duration::from_millis(250);
        let mut instance = probe(&runtime, InstanceLimits { deadline, ..Default::default() });
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hogs: Vec<_> = (0..5)
            .map(|_| {
                let stop = std::sync::Arc::clone(&stop);
                std::thread::spawn(move || {
                    pin_to(0);
                    let mut x = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_add(1));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        let (started, cpu_before) = (Instant::now(), thread_cpu());
        let result = instance.process(&batch(&[&format!("busy {rounds}")]));
        let (wall, cpu) = (started.elapsed(), thread_cpu() - cpu_before);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        hogs.into_iter().for_each(|hog| hog.join().expect("hog"));
        eprintln!("a call of {cpu:?} CPU took {wall:?} of wall time under load; deadline {deadline:?}");
        assert!(wall > deadline, "the load did not hold the call past its deadline ({wall:?}): nothing was shown");
        result.map(|_| ()).map_err(|e| format!("{e} (CPU {cpu:?}, wall {wall:?})"))
    });
    pinned.join().expect("the pinned thread").expect("a call within its CPU time is not interrupted under load");
}

/// A state backend whose every read fails, as a disk would.
struct FailingDisk;

impl sluice::state::StateBackend for FailingDisk {
    fn get(&self, _key: &[u8]) -> sluice::state::Result<Option<Vec<u8>>> {
        Err(sluice::state::Error("reading the state: Input/output error (os error 5)".into()))
    }

    fn scan(
        &self,
        _prefix: &[u8],
        _start_after: Option<&[u8]>,
        _limit: usize,
    ) -> sluice::state::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Err(sluice::state::Error("reading the state: Input/output error (os error 5)".into()))
    }
}

/// A state read that fails in the host's backend is the host's failure,
/// not the guest's: the task retries it with backoff, and the record is
/// never blamed (dead-lettered, or the job failed naming it). Before, it
/// was a trap of the guest.
#[test]
fn a_failing_state_read_is_the_hosts_fault_not_the_records() {
    let (runtime, _cache) = runtime();
    let module = load(&runtime, "probe");
    let state = TaskState::with_backend(Box::new(FailingDisk));
    let mut instance = runtime.instantiate(&module, "test/probe", state, InstanceLimits::default()).expect("instance");
    instance.init(&[]).expect("init");
    let err = instance.process(&batch(&["get a"])).expect_err("the read fails");
    assert_eq!(err.domain(), Domain::Internal, "{err:?}");
    assert!(err.to_string().contains("Input/output error"), "the cause is named: {err}");
}
