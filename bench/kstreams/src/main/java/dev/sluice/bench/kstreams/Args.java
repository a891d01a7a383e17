package dev.sluice.bench.kstreams;

import java.util.HashMap;
import java.util.Map;
import java.util.Set;

/** Command-line options of the form {@code --name value}, each given at most once. */
final class Args {
    private final Map<String, String> values = new HashMap<>();

    /** Parses {@code argv}; every option must be one of {@code known}. */
    Args(String[] argv, Set<String> known) {
        if (argv.length % 2 != 0) {
            throw new IllegalArgumentException("options come in pairs: --name value");
        }
        for (int i = 0; i < argv.length; i += 2) {
            String name = argv[i];
            if (!name.startsWith("--") || !known.contains(name.substring(2))) {
                throw new IllegalArgumentException("unknown option " + name + ", expected --" + String.join(" --", known));
            }
            if (values.put(name.substring(2), argv[i + 1]) != null) {
                throw new IllegalArgumentException("option " + name + " given twice");
            }
        }
    }

    /** The value of a required option. */
    String get(String name) {
        String value = values.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing option --" + name);
        }
        return value;
    }

    /** The value of an option, or {@code fallback} when it was not given. */
    String get(String name, String fallback) {
        return values.getOrDefault(name, fallback);
    }

    /** The value of a required option that is a positive integer. */
    int positiveInt(String name) {
        int value = Integer.parseInt(get(name));
        if (value <= 0) {
            throw new IllegalArgumentException("--" + name + " must be positive, got " + value);
        }
        return value;
    }

    /** The value of a required option that is an integer, zero or more. */
    int nonNegativeInt(String name) {
        int value = Integer.parseInt(get(name));
        if (value < 0) {
            throw new IllegalArgumentException("--" + name + " must not be negative, got " + value);
        }
        return value;
    }
}
