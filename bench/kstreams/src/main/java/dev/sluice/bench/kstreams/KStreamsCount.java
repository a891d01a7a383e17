package dev.sluice.bench.kstreams;

import java.time.Duration;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.Suppressed.BufferConfig;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.state.WindowStore;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Kafka Streams peer of sluice's side-by-side benchmark, exactly-once, with one of two
 * workloads ({@code --workload}).
 *
 * <p>{@code count} (the default): a keyed running count. For every input record it emits one
 * output record with the same key bytes and, as value, the number of records seen so far for that
 * key as decimal ASCII text ("1", "2", ...). The count lives in the persistent RocksDB store
 * "counts" backed by the changelog topic {@code <id>-counts-changelog} (the Kafka Streams
 * default); the record cache is off, so every update is emitted.
 *
 * <p>{@code windowed-count}: per key, the record count of each tumbling event-time window of
 * {@code --window-ms}, emitted once when the window closes, with
 * {@code --out-of-orderness-ms} as the grace period: key = the input key's bytes, value =
 * {@code {"start":S,"end":E,"count":N}}. See {@link #windowedTopology} for the window-close rule
 * and how it compares with Flink's and sluice's watermark.
 *
 * <p>Processing is {@code exactly_once_v2}, and a transaction is committed every
 * {@code --checkpoint-ms}. The key is never changed before an aggregation, so neither topology
 * has a repartition topic. Internal topics are named after the application id ({@code --id}) and
 * fixed store names, so they are stable across builds.
 *
 * <pre>
 * --brokers HOST:PORT  --input TOPIC  --output TOPIC  --id APPLICATION_ID
 * --checkpoint-ms N (commit.interval.ms)  --parallelism P (stream threads)  --state-dir DIR
 * [--workload count|windowed-count]  [--window-ms N  --out-of-orderness-ms N (windowed-count only)]
 * </pre>
 *
 * <p>Prints {@code kafka streams running} to stdout once the instance is RUNNING, then runs until
 * SIGTERM/SIGINT, when it closes within a few seconds. Exits 1 if the instance fails, 2 on bad
 * options.
 */
public final class KStreamsCount {
    private static final Logger LOG = LoggerFactory.getLogger(KStreamsCount.class);

    /** How long the shutdown hook waits for the stream threads to stop. */
    private static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(5);

    private KStreamsCount() {}

    public static void main(String[] argv) throws InterruptedException {
        Properties props = new Properties();
        Topology topology;
        try {
            Args args = new Args(argv, Set.of("brokers", "input", "output", "id", "checkpoint-ms", "parallelism",
                    "state-dir", "workload", "window-ms", "out-of-orderness-ms"));
            props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("brokers"));
            props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("id"));
            props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, args.positiveInt("checkpoint-ms"));
            props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, args.positiveInt("parallelism"));
            props.put(StreamsConfig.STATE_DIR_CONFIG, args.get("state-dir"));
            topology = topology(args);
        } catch (IllegalArgumentException e) { // includes NumberFormatException
            System.err.println("KStreamsCount: " + e.getMessage());
            System.exit(2);
            return;
        }
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

        LOG.info("{}", topology.describe());
        KafkaStreams streams = new KafkaStreams(topology, props);

        // Announce RUNNING once (a rebalance later goes REBALANCING -> RUNNING again) and wake
        // main when the instance stops for good.
        AtomicBoolean announced = new AtomicBoolean();
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.RUNNING && announced.compareAndSet(false, true)) {
                System.out.println("kafka streams running");
                System.out.flush();
            }
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        // Any error in a stream thread ends the whole instance: a benchmark run must not go on
        // with fewer threads than it was given.
        streams.setUncaughtExceptionHandler(e -> {
            LOG.error("stream thread failed, shutting down", e);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(CLOSE_TIMEOUT), "shutdown"));

        streams.start();
        stopped.await();
        if (streams.state() == KafkaStreams.State.ERROR) {
            streams.close(CLOSE_TIMEOUT);
            System.exit(1);
        }
    }

    /** The topology of {@code --workload}, with its options checked. */
    static Topology topology(Args args) {
        String workload = args.get("workload", "count");
        switch (workload) {
            case "count":
                for (String name : new String[] {"window-ms", "out-of-orderness-ms"}) {
                    if (args.get(name, null) != null) {
                        throw new IllegalArgumentException("--" + name + " only applies to --workload windowed-count");
                    }
                }
                return countTopology(args.get("input"), args.get("output"));
            case "windowed-count":
                return windowedTopology(args.get("input"), args.get("output"),
                        args.positiveInt("window-ms"), args.nonNegativeInt("out-of-orderness-ms"));
            default:
                throw new IllegalArgumentException("unknown --workload " + workload + ", expected count or windowed-count");
        }
    }

    /** input -> count per key -> output, as (key bytes, count as decimal text). */
    static Topology countTopology(String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .groupByKey(Grouped.with(Serdes.ByteArray(), Serdes.ByteArray()))
                // Store "counts": RocksDB, changelog topic <id>-counts-changelog.
                .count(Materialized.as("counts"))
                .toStream()
                .mapValues(count -> Long.toString(count))
                .to(output, Produced.with(Serdes.ByteArray(), Serdes.String()));
        return builder.build();
    }

    /**
     * input -> count per key and tumbling window -> (once the window closes) output, as (key
     * bytes, {"start":S,"end":E,"count":N}).
     *
     * <p>Event time is the record's Kafka timestamp (the default timestamp extractor). Windows
     * are {@code [k * window, (k + 1) * window)} in ms since the Unix epoch, as Flink's and
     * sluice's. Kafka Streams has no watermark; it has stream time, the largest timestamp seen so
     * far by a task, that is by one input partition (this topology has one input topic, so one
     * task per partition). With grace = {@code outOfOrdernessMs}:
     *
     * <ul>
     *   <li>a window closes, and {@code suppress(untilWindowCloses)} emits its final count, when
     *       {@code end + grace <= stream time}, checked as records arrive (nothing happens without
     *       input: no punctuation, no wall clock);
     *   <li>a record whose window has {@code end + grace <= stream time} is dropped as late (the
     *       dropped-records metric).
     * </ul>
     *
     * Flink and sluice close a window when {@code end - 1 <= watermark}, the watermark being
     * (largest timestamp - bound - 1 ms) minimised over the partitions, that is when
     * {@code end + bound <= largest timestamp} holds on every partition. So the rule is the same
     * inequality, but here on the key's own partition only, not the minimum over all partitions:
     * Kafka Streams closes a window as early as or earlier than they do (never later), and with
     * input whose disorder is within the bound (each record at most {@code bound} behind the
     * largest timestamp of its partition before it) no record is late in any of them, so the same
     * windows close with the same counts, given input that ends with a record per partition far
     * enough ahead. Input more disordered than that is where they can differ: Kafka Streams
     * drops against its partition's stream time, Flink and sluice against the slower global
     * watermark. Also: a record with a null key is dropped here (Flink and sluice count it under
     * the empty key), and a key that occurs on several input partitions would be counted per
     * partition, since nothing repartitions by key (the benchmark's producer partitions by key).
     *
     * <p>Stores (stable names, so the internal topics are {@code <id>-windowed-counts-changelog}
     * and {@code <id>-windowed-counts-until-close-store-changelog}): the window store
     * "windowed-counts" (RocksDB, retention = window + grace, the default) and the suppression
     * buffer "windowed-counts-until-close" (in memory, unbounded, changelogged). The record cache
     * is off as for the count, so every record updates the window store and the buffer.
     */
    static Topology windowedTopology(String input, String output, long windowMs, long outOfOrdernessMs) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .groupByKey(Grouped.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(windowMs), Duration.ofMillis(outOfOrdernessMs)))
                .count(Materialized.<byte[], Long, WindowStore<Bytes, byte[]>>as("windowed-counts")
                        .withKeySerde(Serdes.ByteArray())
                        .withValueSerde(Serdes.Long()))
                .suppress(Suppressed.untilWindowCloses(BufferConfig.unbounded()).withName("windowed-counts-until-close"))
                .toStream(Named.as("windowed-counts-closed"))
                .map((window, count) -> KeyValue.pair(window.key(),
                        json(window.window().start(), window.window().end(), count)), Named.as("windowed-counts-json"))
                .to(output, Produced.with(Serdes.ByteArray(), Serdes.String()));
        return builder.build();
    }

    /** The value sluice's windowed-count emits, byte for byte. */
    static String json(long start, long end, long count) {
        return "{\"start\":" + start + ",\"end\":" + end + ",\"count\":" + count + "}";
    }
}
