package dev.sluice.bench.flink;

import java.nio.charset.StandardCharsets;
import java.time.Duration;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * The {@code windowed-count} workload of the Flink peer: per key, the number of records in each
 * tumbling event-time window, emitted once when the window closes. The same output as sluice's
 * windowed-count example (examples/rust/windowed-count) with {@code window} = {@code --window-ms}
 * and no allowed lateness.
 *
 * <p>Event time is the Kafka record timestamp: KafkaSource hands each record's
 * {@code ConsumerRecord.timestamp()} to Flink as its event timestamp, and
 * {@link WatermarkStrategy#forBoundedOutOfOrderness} keeps it (its timestamp assigner is the
 * record's own). The watermark is generated per Kafka partition (KafkaSource's split-local
 * watermarks) as the largest timestamp seen minus the bound minus 1 ms, the minimum over
 * partitions, emitted every 200 ms (Flink's default auto-watermark interval); it is sluice's
 * watermark. No idleness: every partition must have data, and each source subtask must own at
 * least one partition (parallelism &lt;= partitions), or the watermark does not advance.
 *
 * <p>Windows are {@code [k * window, (k + 1) * window)} in ms since the Unix epoch
 * ({@link TumblingEventTimeWindows}, no offset). A window fires when the watermark reaches its
 * last millisecond {@code end - 1}, that is when the largest timestamp of every partition is at
 * least {@code end + bound}; allowed lateness is 0 (Flink's default), so a record whose window has
 * fired already (its timestamp {@code t} has {@code end(t) - 1 <= watermark}) is dropped
 * (counted in the operator's numLateRecordsDropped metric), as sluice drops (and counts) it. A
 * record at most {@code bound} behind the largest timestamp of its partition before it is never
 * late.
 *
 * <p>Counting is incremental ({@link CountRecords}, one {@code Long} of window state per key and
 * window); {@link WithBounds} adds the window's bounds when it fires. The output record: key = the
 * input key's bytes (a null key counts as the empty key), value = {@code
 * {"start":S,"end":E,"count":N}} (ASCII, no spaces), no headers, no timestamp given (the producer
 * stamps it), partitioned by the producer's default partitioner on the key.
 */
final class WindowedCount {

    private WindowedCount() {}

    /** source (keys only) -> (hash shuffle by key) -> windowed count -> sink. */
    static void attach(
            StreamExecutionEnvironment env,
            KafkaSource<String> source,
            KafkaSink<Tuple2<String, String>> sink,
            long windowMs,
            long outOfOrdernessMs) {
        WatermarkStrategy<String> watermarks =
                WatermarkStrategy.forBoundedOutOfOrderness(Duration.ofMillis(outOfOrdernessMs));
        env.fromSource(source, watermarks, "kafka-in")
                .keyBy(key -> key, Types.STRING)
                .window(TumblingEventTimeWindows.of(Duration.ofMillis(windowMs)))
                .allowedLateness(Duration.ZERO)
                .aggregate(new CountRecords(), new WithBounds())
                .name("windowed-count")
                .sinkTo(sink)
                .name("kafka-out");
    }

    /** The count of a window, one record at a time. */
    static final class CountRecords implements AggregateFunction<String, Long, Long> {
        @Override
        public Long createAccumulator() {
            return 0L;
        }

        @Override
        public Long add(String key, Long count) {
            return count + 1;
        }

        @Override
        public Long getResult(Long count) {
            return count;
        }

        @Override
        public Long merge(Long a, Long b) {
            return a + b;
        }
    }

    /** (key, {"start":S,"end":E,"count":N}) from a fired window's count. */
    static final class WithBounds extends ProcessWindowFunction<Long, Tuple2<String, String>, String, TimeWindow> {
        @Override
        public void process(String key, Context context, Iterable<Long> counts, Collector<Tuple2<String, String>> out) {
            long count = counts.iterator().next(); // an aggregated window holds exactly one
            TimeWindow window = context.window();
            out.collect(Tuple2.of(key, json(window.getStart(), window.getEnd(), count)));
        }
    }

    /** The value sluice's windowed-count emits, byte for byte. */
    static String json(long start, long end, long count) {
        return "{\"start\":" + start + ",\"end\":" + end + ",\"count\":" + count + "}";
    }

    /** (key, value) as a Kafka record: both as bytes, placed by the default partitioner on the key. */
    static final class WindowRecord implements KafkaRecordSerializationSchema<Tuple2<String, String>> {
        private final String topic;

        WindowRecord(String topic) {
            this.topic = topic;
        }

        @Override
        public ProducerRecord<byte[], byte[]> serialize(
                Tuple2<String, String> element, KafkaSinkContext context, Long timestamp) {
            return new ProducerRecord<>(
                    topic,
                    element.f0.getBytes(StandardCharsets.UTF_8),
                    element.f1.getBytes(StandardCharsets.US_ASCII));
        }
    }
}
