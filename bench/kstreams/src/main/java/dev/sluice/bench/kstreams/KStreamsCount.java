package dev.sluice.bench.kstreams;

import java.time.Duration;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Kafka Streams peer of sluice's side-by-side benchmark: a keyed running count, exactly-once.
 *
 * <p>For every input record it emits one output record with the same key bytes and, as value,
 * the number of records seen so far for that key as decimal ASCII text ("1", "2", ...). The
 * count lives in a persistent RocksDB store backed by a changelog topic (the Kafka Streams
 * default); the record cache is off, so every update is emitted. Processing is
 * {@code exactly_once_v2}, and a transaction is committed every {@code --checkpoint-ms}. The key
 * is never changed, so the topology has no repartition topic.
 *
 * <pre>
 * --brokers HOST:PORT  --input TOPIC  --output TOPIC  --id APPLICATION_ID
 * --checkpoint-ms N (commit.interval.ms)  --parallelism P (stream threads)  --state-dir DIR
 * </pre>
 *
 * <p>Prints {@code kafka streams running} to stdout once the instance is RUNNING, then runs until
 * SIGTERM/SIGINT, when it closes within a few seconds. Exits 1 if the instance fails.
 */
public final class KStreamsCount {
    private static final Logger LOG = LoggerFactory.getLogger(KStreamsCount.class);

    /** How long the shutdown hook waits for the stream threads to stop. */
    private static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(5);

    private KStreamsCount() {}

    public static void main(String[] argv) throws InterruptedException {
        Args args = new Args(argv, Set.of("brokers", "input", "output", "id", "checkpoint-ms", "parallelism", "state-dir"));

        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args.get("brokers"));
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args.get("id"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, args.positiveInt("checkpoint-ms"));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, args.positiveInt("parallelism"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, args.get("state-dir"));
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0L);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");

        Topology topology = topology(args.get("input"), args.get("output"));
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

    /** input -> count per key -> output, as (key bytes, count as decimal text). */
    static Topology topology(String input, String output) {
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
}
