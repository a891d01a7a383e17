use super::*;

fn config(lag_ms: u64, idle_ms: Option<u64>) -> TimeConfig {
    TimeConfig { max_out_of_orderness: Duration::from_millis(lag_ms), idle_timeout: idle_ms.map(Duration::from_millis) }
}

#[test]
fn timer_keys_sort_by_clock_then_time_and_round_trip() {
    let timer = |clock, at: i64, key: &str| Timer { clock, at, key: key.as_bytes().to_vec() };
    let timers = [
        timer(Clock::Event, i64::MIN, "z"),
        timer(Clock::Event, -5, "a"),
        timer(Clock::Event, 0, ""),
        timer(Clock::Event, 7, "a"),
        timer(Clock::Event, 7, "b"),
        timer(Clock::Event, i64::MAX, "a"),
        timer(Clock::Processing, i64::MIN, "a"),
    ];
    let keys: Vec<Vec<u8>> = timers.iter().map(timer_key).collect();
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "keys sort in clock, time, key order");
    for (timer, key) in timers.iter().zip(&keys) {
        assert!(is_reserved(key));
        assert!(key.as_slice() < after_reserved().as_slice());
        assert_eq!(decode_timer(timer.clock, key).as_ref(), Some(timer));
    }
    assert_eq!(decode_timer(Clock::Processing, &keys[0]), None, "another clock's key is not this clock's timer");
    assert_eq!(decode_timer(Clock::Event, &timer_prefix(Clock::Event)), None, "no time: not a timer");
    assert!(!is_reserved(b"count\x00k"));
    assert!(b"\xffsluice\x01".as_slice() > after_reserved().as_slice());
}

#[test]
fn the_watermark_is_the_slowest_partition_less_the_lag_and_never_goes_back() {
    let start = Instant::now();
    let parts = [("a".to_string(), 0), ("b".to_string(), 0), ("a".to_string(), 1)];
    let mut time = EventTime::new(config(100, None), &parts, start);
    time.observe(0, "a", Some(1_000), start);
    time.advance(start);
    assert_eq!(time.watermark(0), None, "b has sent nothing and is not idle");
    time.observe(0, "b", Some(600), start);
    time.advance(start);
    assert_eq!(time.watermark(0), Some(499), "b's largest less the lag, less 1 ms");
    let w = time.watermark(0);
    assert!(is_late(Some(499), w) && !is_late(Some(500), w) && !is_late(None, w));
    time.observe(0, "b", Some(400), start);
    time.advance(start);
    assert_eq!(time.watermark(0), Some(499), "an older record moves nothing");
    time.observe(0, "b", Some(5_000), start);
    time.advance(start);
    assert_eq!(time.watermark(0), Some(899), "now a is the slowest");
    assert_eq!(time.watermark(1), None, "shards keep their own time");
}

#[test]
fn an_idle_partition_stops_holding_the_watermark_back() {
    let start = Instant::now();
    let parts = [("a".to_string(), 0), ("b".to_string(), 0)];
    let mut time = EventTime::new(config(0, Some(1_000)), &parts, start);
    time.observe(0, "a", Some(10), start);
    time.advance(start + Duration::from_millis(500));
    assert_eq!(time.watermark(0), None);
    time.observe(0, "a", Some(20), start + Duration::from_millis(900));
    time.advance(start + Duration::from_millis(1_000));
    assert_eq!(time.watermark(0), Some(19), "b idle since the start");
    time.advance(start + Duration::from_millis(5_000));
    assert_eq!(time.watermark(0), Some(19), "all idle: the largest seen");
    time.observe(0, "b", Some(15), start + Duration::from_millis(5_000));
    time.advance(start + Duration::from_millis(5_000));
    assert_eq!(time.watermark(0), Some(19), "b is back, behind: the watermark stays");
}

#[test]
fn event_time_survives_a_restart_through_what_the_barrier_stores() {
    let start = Instant::now();
    let parts = [("a".to_string(), 3), ("b".to_string(), 3)];
    let mut time = EventTime::new(config(0, None), &parts, start);
    assert!(time.take_changed().is_empty());
    time.observe(3, "a", Some(50), start);
    time.observe(3, "b", Some(70), start);
    time.advance(start);
    let stored = time.take_changed();
    assert_eq!(stored.len(), 1);
    assert!(time.take_changed().is_empty(), "stored once per change");

    let mut restored = EventTime::new(config(0, None), &parts, start);
    restored.restore(3, &stored[0].1).expect("parses");
    assert_eq!(restored.watermark(3), Some(49));
    restored.observe(3, "a", Some(90), start);
    restored.advance(start);
    assert_eq!(restored.watermark(3), Some(69), "b's largest came back too");
    assert!(restored.restore(3, b"not json").is_err());
}

#[test]
fn next_timer_bounds_say_when_a_scan_is_worth_it() {
    let start = Instant::now();
    let mut time = EventTime::new(config(0, None), &[("a".to_string(), 0)], start);
    assert!(!time.may_be_due(0, Clock::Event, Some(i64::MAX)));
    time.note_timer(0, Clock::Event, 100);
    time.note_timer(0, Clock::Event, 300);
    assert!(!time.may_be_due(0, Clock::Event, Some(99)));
    assert!(!time.may_be_due(0, Clock::Event, None));
    assert!(time.may_be_due(0, Clock::Event, Some(100)));
    assert!(!time.may_be_due(0, Clock::Processing, Some(100)));
    time.set_next_timer(0, Clock::Event, Some(300));
    assert!(!time.may_be_due(0, Clock::Event, Some(299)));
}

#[test]
fn observing_a_batch_at_once_is_observing_each_record() {
    let start = Instant::now();
    let parts = [("a".to_string(), 0), ("b".to_string(), 0)];
    let records = [("a", Some(500)), ("a", None), ("a", Some(300)), ("b", Some(900)), ("b", None), ("a", Some(700))];
    let mut each = EventTime::new(config(100, None), &parts, start);
    let mut batch = EventTime::new(config(100, None), &parts, start);
    for (topic, timestamp) in records {
        each.observe(0, topic, timestamp, start);
    }
    batch.observe_all(0, records, start);
    each.advance(start);
    batch.advance(start);
    assert_eq!(batch.watermark(0), Some(599), "a's largest (700) less the lag, less 1 ms");
    assert_eq!(batch.watermark(0), each.watermark(0));
    assert_eq!(batch.take_changed(), each.take_changed(), "the same largest timestamps are checkpointed");
}
