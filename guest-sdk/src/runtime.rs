//! The glue between the generated `Guest` trait and a [`Transform`]: what
//! [`export!`](crate::export) expands to calls these functions.
//!
//! It owns the batch lifecycle (hooks, then state write-back, or discard on
//! error) and the rule that user errors become WIT error strings, never
//! traps. It must never panic on anything the host or the user hands it.

use std::cell::RefCell;
use std::thread::LocalKey;

use crate::bindings::{InputRecord, OutputRecord};
use crate::config::Config;
use crate::emit::Emitter;
use crate::error::Result;
use crate::record::Batch;
use crate::state::store;
use crate::time::Timer;
use crate::transform::Transform;

/// Where [`export!`](crate::export) keeps the instance.
pub(crate) type Slot<T> = LocalKey<RefCell<Option<T>>>;

/// `init`: builds the transform from its configuration.
pub fn init<T: Transform>(slot: &'static Slot<T>, config: Vec<(String, String)>) -> Result<(), String> {
    let config = Config::new(config);
    discard_state();
    match T::init(&config).and_then(|t| finish_state().map(|()| t)) {
        Ok(transform) => slot.with(|cell| match cell.try_borrow_mut() {
            Ok(mut instance) => {
                *instance = Some(transform);
                Ok(())
            }
            Err(_) => Err("init called while the transform is running".to_string()),
        }),
        Err(e) => {
            discard_state();
            Err(e.to_string())
        }
    }
}

/// `process`: runs one batch through the transform.
pub fn process<T: Transform>(slot: &'static Slot<T>, batch: Vec<InputRecord>) -> Result<Vec<OutputRecord>, String> {
    with_instance(slot, "process", |transform| {
        let batch = Batch::new(batch);
        let mut out = Emitter::with_capacity(batch.len());
        run_batch(transform, &batch, &mut out)?;
        out.into_records()
    })
}

/// `process-packed`: runs one packed batch through the transform. Its
/// shard's state may stay held in the store when it returns (see
/// [`hold_state`] and [`flush_state`]).
pub fn process_packed<T: Transform>(slot: &'static Slot<T>, batch: Vec<u8>) -> Result<Vec<OutputRecord>, String> {
    run_packed(slot, batch, Emitter::into_records)
}

/// `process-packed-out`: [`process_packed`], with the outputs returned as
/// one `packed-outputs` byte string.
pub fn process_packed_out<T: Transform>(slot: &'static Slot<T>, batch: Vec<u8>) -> Result<Vec<u8>, String> {
    run_packed(slot, batch, |out| Ok(out.into_packed()))
}

/// Runs a packed batch through the transform, scoped to its shard, and
/// hands the outputs back as `outputs` makes them.
fn run_packed<T: Transform, R>(
    slot: &'static Slot<T>,
    batch: Vec<u8>,
    outputs: impl FnOnce(Emitter) -> Result<R>,
) -> Result<R, String> {
    let batch = Batch::from_packed(batch).map_err(|e| e.to_string())?;
    let shard = batch.records().first().and_then(|r| u32::try_from(r.partition()).ok());
    with_instance_of(slot, "process", shard, |transform| {
        let mut out = Emitter::with_capacity(batch.len());
        run_batch(transform, &batch, &mut out)?;
        outputs(out)
    })
}

/// `hold-state`: the host's word that it will collect held state, and how
/// much the store may hold.
pub fn hold_state(max_bytes: u64) {
    // Only fails if the store is borrowed, which cannot happen between
    // calls; then nothing is held, as with an older host.
    let _ = store::with(|s| {
        s.allow_holding(usize::try_from(max_bytes).unwrap_or(usize::MAX));
        Ok(())
    });
}

/// `flush-state`: writes back what the store holds of `shard`.
pub fn flush_state(shard: u32) -> Result<(), String> {
    store::with(|s| {
        s.give_back(shard);
        Ok(())
    })
    .map_err(|e| {
        discard_state();
        e.to_string()
    })
}

/// `on-timers`: hands each due timer to the transform, then writes the
/// state back as a batch does.
pub fn on_timers<T: Transform>(slot: &'static Slot<T>, fired: Vec<Timer>) -> Result<Vec<OutputRecord>, String> {
    with_instance(slot, "on-timers", |transform| {
        let mut out = Emitter::with_capacity(fired.len());
        for timer in &fired {
            if crate::state::ttl::expire(timer)? {
                continue;
            }
            transform.on_timer(timer, &mut out).map_err(|e| {
                let key = String::from_utf8_lossy(&timer.key);
                e.context(format_args!("timer {:?} {key:?}@{}", timer.clock, timer.at))
            })?;
        }
        finish_state()?;
        out.into_records()
    })
}

/// `migrate`: lets the transform convert the state of the module it
/// replaces; its state writes are written back like a batch's.
pub fn migrate<T: Transform>(slot: &'static Slot<T>, from_module: String) -> Result<(), String> {
    with_instance(slot, "migrate", |transform| transform.migrate(&from_module).and_then(|()| finish_state()))
}

/// Runs `call` on the instance in `slot` for the export `name` (named in
/// errors), from an empty state cache, which is discarded again if `call`
/// fails.
fn with_instance<T: Transform, R>(
    slot: &'static Slot<T>,
    name: &str,
    call: impl FnOnce(&mut T) -> Result<R>,
) -> Result<R, String> {
    with_instance_of(slot, name, None, call)
}

/// [`with_instance`] for a call of `shard`, whose state the store may hold
/// from call to call.
fn with_instance_of<T: Transform, R>(
    slot: &'static Slot<T>,
    name: &str,
    shard: Option<u32>,
    call: impl FnOnce(&mut T) -> Result<R>,
) -> Result<R, String> {
    slot.with(|cell| {
        let mut instance =
            cell.try_borrow_mut().map_err(|_| format!("{name} called while the transform is running"))?;
        let transform = instance.as_mut().ok_or_else(|| format!("{name} called before init"))?;
        // Only fails if the store is borrowed, which cannot happen between
        // calls.
        let _ = store::with(|s| {
            s.begin(shard);
            Ok(())
        });
        crate::time::new_call();
        call(transform).map_err(|e| {
            discard_state();
            e.to_string()
        })
    })
}

fn run_batch<T: Transform>(transform: &mut T, batch: &Batch, out: &mut Emitter) -> Result<()> {
    transform.begin_batch(batch).map_err(|e| e.context("begin_batch"))?;
    for record in batch {
        transform.process(record, out).map_err(|e| {
            e.context(format_args!("record {}-{}@{}", record.topic(), record.partition(), record.offset()))
        })?;
    }
    transform.end_batch(out).map_err(|e| e.context("end_batch"))?;
    finish_state()
}

fn finish_state() -> Result<()> {
    store::with(|s| {
        s.end();
        Ok(())
    })
}

fn discard_state() {
    // Only fails if the store is borrowed, which cannot happen between hooks.
    let _ = store::with(|s| {
        s.discard();
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Record;
    use crate::record::tests::input;
    use crate::state::ValueState;

    const SEEN: ValueState<u64> = ValueState::new("seen");

    struct Counter {
        fail_on: Option<String>,
        ended: u32,
    }

    impl Transform for Counter {
        fn init(config: &Config) -> Result<Self> {
            if config.get("bad").is_some() {
                return Err("bad config".into());
            }
            Ok(Counter { fail_on: config.get("fail_on").map(str::to_owned), ended: 0 })
        }

        fn begin_batch(&mut self, batch: &Batch) -> Result<()> {
            SEEN.prefetch(batch.keys())
        }

        fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()> {
            let n = SEEN.update(record.key_or_empty(), |n| n.unwrap_or(0) + 1)?;
            if record.value_str()? == self.fail_on.as_deref().unwrap_or("\0") {
                return Err("asked to fail".into());
            }
            out.emit(record.key_or_empty(), n.to_string());
            Ok(())
        }

        fn end_batch(&mut self, out: &mut Emitter) -> Result<()> {
            self.ended += 1;
            out.emit("end", self.ended.to_string());
            Ok(())
        }
    }

    thread_local! {
        static SLOT: RefCell<Option<Counter>> = const { RefCell::new(None) };
    }

    fn batch(records: &[(Option<&str>, &str)]) -> Vec<InputRecord> {
        records.iter().map(|(k, v)| input(*k, Some(v.as_bytes()))).collect()
    }

    fn values(out: &[OutputRecord]) -> Vec<String> {
        out.iter().map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()).collect()
    }

    #[test]
    fn lifecycle() {
        crate::state::tests::reset();
        assert_eq!(process(&SLOT, batch(&[(Some("a"), "x")])).unwrap_err(), "process called before init");
        assert_eq!(init(&SLOT, vec![("bad".into(), "1".into())]).unwrap_err(), "bad config");
        assert_eq!(process(&SLOT, Vec::new()).unwrap_err(), "process called before init");
        init(&SLOT, vec![("fail_on".into(), "boom".into())]).unwrap();

        let out = process(&SLOT, batch(&[(Some("a"), "x"), (None, "y"), (Some("a"), "z")])).unwrap();
        assert_eq!(values(&out), ["1", "1", "2", "1"]);
        assert_eq!(out[1].key.as_deref(), Some(&b""[..]));
        let calls = crate::state::tests::calls();
        assert_eq!((calls.get_many, calls.write, calls.total()), (1, 1, 2), "O(1) crossings per batch");

        // A failing batch leaves no state behind ...
        let e = process(&SLOT, batch(&[(Some("a"), "x"), (Some("a"), "boom")])).unwrap_err();
        assert_eq!(e, "record events-3@41: asked to fail");
        assert_eq!(crate::state::tests::calls().write, 1);
        // ... so its replay sees the state of the last good batch.
        let out = process(&SLOT, batch(&[(Some("a"), "x")])).unwrap();
        assert_eq!(values(&out), ["3", "2"]);
        assert_eq!(crate::state::tests::calls().write, 2);
    }

    #[test]
    fn a_packed_batch_runs_as_the_list_does() {
        crate::state::tests::reset();
        init(&SLOT, vec![("fail_on".into(), "boom".into())]).unwrap();
        let records = batch(&[(Some("a"), "x"), (None, "y"), (Some("a"), "z")]);
        let packed = crate::record::tests::pack(&records);
        let out = process_packed(&SLOT, packed).unwrap();
        assert_eq!(values(&out), ["1", "1", "2", "1"]);
        let out = process(&SLOT, records).unwrap();
        assert_eq!(values(&out), ["3", "2", "4", "2"]);
        let e = process_packed(&SLOT, crate::record::tests::pack(&batch(&[(Some("a"), "boom")]))).unwrap_err();
        assert_eq!(e, "record events-3@41: asked to fail");
        assert!(process_packed(&SLOT, vec![1, 2]).unwrap_err().starts_with("malformed packed batch"));
    }

    #[test]
    fn packed_outputs_are_the_packed_records_of_the_list() {
        crate::state::tests::reset();
        init(&SLOT, vec![("fail_on".into(), "boom".into())]).unwrap();
        let records = batch(&[(Some("a"), "x"), (None, "y"), (Some("a"), "z")]);
        let packed = process_packed_out(&SLOT, crate::record::tests::pack(&records)).unwrap();
        crate::state::tests::reset();
        init(&SLOT, vec![("fail_on".into(), "boom".into())]).unwrap();
        let listed = process(&SLOT, records).unwrap();
        assert_eq!(values(&listed), ["1", "1", "2", "1"]);
        let mut relisted = Emitter::default();
        for r in &listed {
            relisted.emit(r.key.as_deref().unwrap_or_default(), r.value.as_deref().unwrap_or_default());
        }
        assert_eq!(packed, relisted.into_packed());
        let e = process_packed_out(&SLOT, crate::record::tests::pack(&batch(&[(Some("a"), "boom")]))).unwrap_err();
        assert_eq!(e, "record events-3@41: asked to fail");
    }

    const TOTAL: ValueState<u64> = ValueState::new("total");

    /// A new version of `Counter` that keeps `total = 10 * seen`.
    struct Upgraded;

    impl Transform for Upgraded {
        fn init(_: &Config) -> Result<Self> {
            Ok(Upgraded)
        }

        fn process(&mut self, record: &Record, out: &mut Emitter) -> Result<()> {
            let n = TOTAL.get(record.key_or_empty())?.unwrap_or(0);
            out.emit(record.key_or_empty(), n.to_string());
            Ok(())
        }

        fn migrate(&mut self, from_module: &str) -> Result<()> {
            if from_module != "old" {
                return Err(format!("cannot migrate from {from_module}").into());
            }
            let seen = SEEN.get("a")?.unwrap_or(0);
            SEEN.clear("a")?;
            TOTAL.set("a", &(seen * 10))
        }
    }

    thread_local! {
        static UPGRADED: RefCell<Option<Upgraded>> = const { RefCell::new(None) };
    }

    #[test]
    fn migrate_converts_the_old_state_and_writes_it_back_once() {
        crate::state::tests::reset();
        assert_eq!(migrate(&UPGRADED, "old".into()).unwrap_err(), "migrate called before init");
        init(&SLOT, Vec::new()).unwrap();
        process(&SLOT, batch(&[(Some("a"), "x"), (Some("a"), "y")])).unwrap();
        init(&UPGRADED, Vec::new()).unwrap();
        let writes = crate::state::tests::calls().write;
        assert_eq!(migrate(&UPGRADED, "other".into()).unwrap_err(), "cannot migrate from other");
        assert_eq!(crate::state::tests::calls().write, writes, "a failed migration writes nothing");
        migrate(&UPGRADED, "old".into()).unwrap();
        assert_eq!(crate::state::tests::calls().write, writes + 1, "one write for the whole migration");
        let out = process(&UPGRADED, batch(&[(Some("a"), "x")])).unwrap();
        assert_eq!(values(&out), ["20"]);
    }
}
