import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.concurrent.atomic.LongAdder;

// Java workloads for `cargo xtask bench`. Prints "ready" first.
//
//   throughput THREADS [quiet]
//       THREADS workers run small operations (hash map, sort, string building: allocation, GC and
//       JIT-compiled code, like a service handling requests). Unless quiet, prints
//       "ops COUNT NANOS" every 100 ms: operations done so far and System.nanoTime, taken together
//       so that a rate between two reports is exact.
//   deep DEPTH THREADS
//       THREADS workers recurse DEPTH Java frames deep, then spin in a leaf method, so nearly every
//       sample has a stack of that depth.
public class Bench {
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        if (mode.equals("throughput")) {
            int threads = Integer.parseInt(args[1]);
            boolean quiet = args.length > 2 && args[2].equals("quiet");
            throughput(threads, quiet);
        } else if (mode.equals("deep")) {
            deep(Integer.parseInt(args[1]), Integer.parseInt(args[2]));
        } else {
            throw new IllegalArgumentException("unknown mode " + mode);
        }
    }

    // ---- throughput ----

    static void throughput(int threads, boolean quiet) throws Exception {
        LongAdder ops = new LongAdder();
        for (int t = 0; t < threads; t++) {
            long seed = t * 1_000_003L;
            start("worker-" + t, () -> {
                long s = seed;
                while (true) {
                    s = operation(s);
                    ops.increment();
                }
            });
        }
        System.out.println("ready");
        System.out.flush();
        while (true) {
            Thread.sleep(100);
            if (!quiet) {
                long count = ops.sum();
                long now = System.nanoTime();
                System.out.println("ops " + count + " " + now);
                System.out.flush();
            }
        }
    }

    static long operation(long seed) {
        HashMap<String, Integer> map = fill(seed);
        ArrayList<String> keys = new ArrayList<>(map.keySet());
        Collections.sort(keys);
        return seed * 31 + render(keys, map).hashCode();
    }

    static HashMap<String, Integer> fill(long seed) {
        HashMap<String, Integer> map = new HashMap<>();
        for (int i = 0; i < 32; i++) {
            long key = Math.floorMod(seed + i * 7919L, 100_000L);
            map.put("key-" + key, i);
        }
        return map;
    }

    static String render(ArrayList<String> keys, HashMap<String, Integer> map) {
        StringBuilder text = new StringBuilder();
        for (String key : keys) {
            text.append(key).append('=').append(map.get(key)).append(';');
        }
        return text.toString();
    }

    // ---- deep ----

    static void deep(int depth, int threads) throws Exception {
        for (int t = 0; t < threads; t++) {
            start("deep-" + t, () -> {
                while (true) {
                    sink += recurse(depth, sink);
                }
            });
        }
        System.out.println("ready");
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
    }

    static long recurse(int depth, long seed) {
        if (depth == 0) {
            return leaf(seed);
        }
        return recurse(depth - 1, seed) + 1;
    }

    // About 10 ms of work: the recursion itself is a negligible share of the samples.
    static long leaf(long seed) {
        long acc = seed;
        for (int i = 0; i < 5_000_000; i++) {
            acc ^= acc << 13;
            acc ^= acc >>> 7;
            acc ^= acc << 17;
        }
        return acc;
    }

    static void start(String name, Runnable body) {
        Thread thread = new Thread(body, name);
        thread.setDaemon(true);
        thread.start();
    }
}
