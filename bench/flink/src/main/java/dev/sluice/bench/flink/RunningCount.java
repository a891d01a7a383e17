package dev.sluice.bench.flink;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.stream.Stream;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.CoreOptions;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.configuration.WebOptions;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * The Apache Flink peer of sluice's side-by-side benchmark, exactly-once from Kafka to Kafka, with
 * one of two workloads ({@code --workload}).
 *
 * <p>{@code count} (the default): a keyed running count. Reads the input topic from the earliest
 * offset, keys each record by its Kafka key, counts the records seen per key in
 * {@code ValueState<Long>} and writes {@code (key, count)} to the output topic: record key = the
 * input key's bytes, value = the count as decimal ASCII, no headers, partitioned by the Kafka
 * producer's default partitioner on the key. The input value is ignored. A read_committed
 * consumer sees every count exactly once, 1..n per key in partition order.
 *
 * <p>{@code windowed-count}: a count per key and tumbling event-time window, see
 * {@link WindowedCount}: one record per key and window [start, end) of {@code --window-ms},
 * aligned to the Unix epoch, on the records' Kafka timestamps, with the watermark
 * {@code forBoundedOutOfOrderness(--out-of-orderness-ms)}; key = the input key's bytes, value =
 * {@code {"start":S,"end":E,"count":N}}.
 *
 * <p>Checkpoints are EXACTLY_ONCE (hashmap state backend, checkpoints kept on the JobManager
 * heap) and the sink writes in Kafka transactions committed per checkpoint.
 *
 * <p>The job runs in a local MiniCluster inside this JVM and is unbounded: it runs until the
 * process is terminated (SIGTERM), which the benchmark harness does once all output is
 * committed. Prints {@code flink job running} to stdout once the job is submitted.
 *
 * <p>Usage: {@code --brokers HOST:PORT --input TOPIC --output TOPIC --id NAME --checkpoint-ms N
 * --parallelism P [--workload count|windowed-count] [--window-ms N --out-of-orderness-ms N]}
 * (the last two are required with, and only allowed with, {@code windowed-count}). NAME is the
 * consumer group id and the transactional id prefix, so it must be unique per run.
 */
public final class RunningCount {

    private static final String USAGE = "usage: RunningCount --brokers HOST:PORT --input TOPIC"
            + " --output TOPIC --id NAME --checkpoint-ms N --parallelism P"
            + " [--workload count|windowed-count] [--window-ms N --out-of-orderness-ms N]";

    /** How long shutdown hooks may take after SIGTERM before the JVM is halted. */
    private static final long SHUTDOWN_GRACE_MS = 3_000;

    private RunningCount() {}

    public static void main(String[] argv) throws Exception {
        String brokers, input, output, id;
        long checkpointMs;
        int parallelism;
        String workload;
        long windowMs = 0, outOfOrdernessMs = 0;
        try {
            Map<String, String> args = parseArgs(argv);
            brokers = required(args, "brokers");
            input = required(args, "input");
            output = required(args, "output");
            id = required(args, "id");
            checkpointMs = Long.parseLong(required(args, "checkpoint-ms"));
            parallelism = Integer.parseInt(required(args, "parallelism"));
            workload = args.getOrDefault("workload", "count");
            switch (workload) {
                case "count":
                    for (String name : new String[] {"window-ms", "out-of-orderness-ms"}) {
                        if (args.containsKey(name)) {
                            throw new IllegalArgumentException(
                                    "--" + name + " only applies to --workload windowed-count");
                        }
                    }
                    break;
                case "windowed-count":
                    windowMs = Long.parseLong(required(args, "window-ms"));
                    outOfOrdernessMs = Long.parseLong(required(args, "out-of-orderness-ms"));
                    if (windowMs <= 0 || outOfOrdernessMs < 0) {
                        throw new IllegalArgumentException("--window-ms must be positive and"
                                + " --out-of-orderness-ms not negative");
                    }
                    break;
                default:
                    throw new IllegalArgumentException("unknown --workload " + workload
                            + ", expected count or windowed-count");
            }
        } catch (IllegalArgumentException e) { // includes NumberFormatException
            System.err.println(e.getMessage() + "\n" + USAGE);
            System.exit(2);
            return;
        }

        Configuration conf = new Configuration();
        conf.set(StateBackendOptions.STATE_BACKEND, "hashmap");
        conf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "jobmanager");
        conf.set(CheckpointingOptions.CHECKPOINTING_INTERVAL, Duration.ofMillis(checkpointMs));
        conf.set(CheckpointingOptions.CHECKPOINTING_CONSISTENCY_MODE, CheckpointingMode.EXACTLY_ONCE);
        conf.set(CheckpointingOptions.MIN_PAUSE_BETWEEN_CHECKPOINTS, Duration.ZERO);
        // Any free port for the MiniCluster's REST endpoint, so that runs side by side don't clash.
        conf.set(RestOptions.BIND_PORT, "0");
        // The MiniCluster's scratch files (among them a 21 MB copy of the Pekko RPC jar, deleted
        // only when the cluster closes, which a SIGTERM'd JVM never does) go into a directory of
        // this run that the shutdown hook removes.
        Path scratch = Files.createTempDirectory("sluice-bench-flink-");
        conf.set(CoreOptions.TMP_DIRS, scratch.toString());
        conf.set(WebOptions.TMP_DIR, scratch.toString());
        installShutdownHook(scratch);

        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(parallelism);

        KafkaSource<String> source = KafkaSource.<String>builder()
                .setBootstrapServers(brokers)
                .setTopics(input)
                .setGroupId(id)
                .setStartingOffsets(OffsetsInitializer.earliest())
                .setDeserializer(new KeyOnly())
                .build();

        if (workload.equals("count")) {
            KafkaSink<Tuple2<String, Long>> sink = exactlyOnceSink(brokers, id, new CountRecord(output));
            // source -> (hash shuffle by key) -> count -> sink; count and sink chain into one task.
            env.fromSource(source, WatermarkStrategy.noWatermarks(), "kafka-in")
                    .keyBy(key -> key, Types.STRING)
                    .process(new Count())
                    .name("count")
                    .sinkTo(sink)
                    .name("kafka-out");
        } else {
            WindowedCount.attach(env, source, exactlyOnceSink(brokers, id, new WindowedCount.WindowRecord(output)),
                    windowMs, outOfOrdernessMs);
        }

        JobClient job = env.executeAsync("sluice-bench " + workload + " " + id);
        System.out.println("flink job running");
        System.out.flush();
        // Unbounded: this only returns if the job fails for good (the restart strategy gave up).
        try {
            job.getJobExecutionResult().get();
        } catch (ExecutionException e) {
            e.getCause().printStackTrace();
            System.exit(1);
        }
    }

    /** An EXACTLY_ONCE Kafka sink: transactions committed per checkpoint, ids prefixed with {@code id}. */
    static <T> KafkaSink<T> exactlyOnceSink(String brokers, String id, KafkaRecordSerializationSchema<T> records) {
        return KafkaSink.<T>builder()
                .setBootstrapServers(brokers)
                .setRecordSerializer(records)
                .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
                .setTransactionalIdPrefix(id)
                // Flink's default (1 h) exceeds the broker's transaction.max.timeout.ms (15 min).
                .setProperty("transaction.timeout.ms", "60000")
                .build();
    }

    /**
     * Emits each record's key as a UTF-8 string (a null key counts as ""); the value is ignored.
     * A String rather than the raw byte[]: Flink cannot key a stream by an array (arrays hash by
     * identity), and the benchmark's keys are UTF-8 text, so the round trip is exact. The record's
     * Kafka timestamp needs no field: KafkaSource attaches it to the element as its event
     * timestamp (used by windowed-count).
     */
    static final class KeyOnly implements KafkaRecordDeserializationSchema<String> {
        @Override
        public void deserialize(ConsumerRecord<byte[], byte[]> record, Collector<String> out) {
            byte[] key = record.key();
            out.collect(key == null ? "" : new String(key, StandardCharsets.UTF_8));
        }

        @Override
        public TypeInformation<String> getProducedType() {
            return Types.STRING;
        }
    }

    /** The running count per key: emits (key, number of records seen so far for the key). */
    static final class Count extends KeyedProcessFunction<String, String, Tuple2<String, Long>> {
        private transient ValueState<Long> count;

        @Override
        public void open(OpenContext context) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
        }

        @Override
        public void processElement(String key, Context ctx, Collector<Tuple2<String, Long>> out)
                throws Exception {
            Long previous = count.value();
            long next = previous == null ? 1 : previous + 1;
            count.update(next);
            out.collect(Tuple2.of(key, next));
        }
    }

    /**
     * (key, count) as a Kafka record: key bytes, the count in decimal ASCII, no partition given,
     * so the producer's default partitioner places it by key.
     */
    static final class CountRecord implements KafkaRecordSerializationSchema<Tuple2<String, Long>> {
        private final String topic;

        CountRecord(String topic) {
            this.topic = topic;
        }

        @Override
        public ProducerRecord<byte[], byte[]> serialize(
                Tuple2<String, Long> element, KafkaSinkContext context, Long timestamp) {
            return new ProducerRecord<>(
                    topic,
                    element.f0.getBytes(StandardCharsets.UTF_8),
                    Long.toString(element.f1).getBytes(StandardCharsets.US_ASCII));
        }
    }

    /**
     * On SIGTERM the JVM runs its shutdown hooks, Flink's and this one, which removes the run's
     * scratch directory. Should a hook stall, a watchdog halts the JVM after a short grace
     * period rather than let it linger; it is a daemon thread, so a prompt exit does not wait.
     */
    private static void installShutdownHook(Path scratch) {
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            Thread watchdog = new Thread(() -> {
                try {
                    Thread.sleep(SHUTDOWN_GRACE_MS);
                } catch (InterruptedException e) {
                    return;
                }
                Runtime.getRuntime().halt(143);
            }, "shutdown-watchdog");
            watchdog.setDaemon(true);
            watchdog.start();
            deleteTree(scratch);
        }, "sluice-bench-shutdown"));
    }

    /** Deletes a directory tree, best effort (Flink's own hooks may be removing parts of it). */
    private static void deleteTree(Path root) {
        try (Stream<Path> paths = Files.walk(root)) {
            paths.sorted(Comparator.reverseOrder()).forEach(path -> {
                try {
                    Files.deleteIfExists(path);
                } catch (IOException e) {
                    // Best effort: a file still being written or already gone.
                }
            });
        } catch (IOException e) {
            // The tree is already gone.
        }
    }

    /** Parses {@code --name value} pairs. */
    static Map<String, String> parseArgs(String[] argv) {
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
                throw new IllegalArgumentException("expected --name value pairs, got: " + argv[i]);
            }
            args.put(argv[i].substring(2), argv[i + 1]);
        }
        return args;
    }

    static String required(Map<String, String> args, String name) {
        String value = args.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }
}
