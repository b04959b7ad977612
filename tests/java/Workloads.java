import java.util.zip.CRC32;
import java.util.zip.Deflater;

// Java workloads with known CPU splits and call chains, one named thread each:
//   split-worker   spends 60% / 30% / 10% of its time in splitA / splitB / splitC;
//   deep-worker    recurses 200 frames deep, then spins in a hot leaf;
//   inline-worker  calls tiny methods the JIT inlines (inlineOuter -> inlineMiddle -> inlineInner),
//                  whose innermost one makes a megamorphic (never inlined) call to the hot leaf, so
//                  the inlined chain is recorded at that call site even without DebugNonSafepoints;
//   zip-worker     calls into native code (java.util.zip: Deflater and CRC32).
// Arguments, if any, name the only workers to start (e.g. `deep-worker`).
// Prints "ready" once every thread runs.
public class Workloads {
    static volatile long sink;

    // Work units are equal: the same loop, run 6, 3 and 1 times per round. The unit is called
    // through three identical classes (a megamorphic call the JIT never inlines), so each sample's
    // split method is a caller frame, whose debug info is exact.
    interface Unit {
        long spin(long seed);
    }

    static final class Unit1 implements Unit {
        public long spin(long seed) {
            long acc = seed;
            for (int i = 0; i < 200_000; i++) {
                acc = acc * 6364136223846793005L + 1442695040888963407L;
            }
            return acc;
        }
    }

    static final class Unit2 implements Unit {
        public long spin(long seed) {
            long acc = seed;
            for (int i = 0; i < 200_000; i++) {
                acc = acc * 6364136223846793005L + 1442695040888963407L;
            }
            return acc;
        }
    }

    static final class Unit3 implements Unit {
        public long spin(long seed) {
            long acc = seed;
            for (int i = 0; i < 200_000; i++) {
                acc = acc * 6364136223846793005L + 1442695040888963407L;
            }
            return acc;
        }
    }

    static final Unit[] UNITS = {new Unit1(), new Unit2(), new Unit3()};
    static int next;

    static long spin(long seed) {
        return UNITS[next++ % 3].spin(seed);
    }

    static long splitA(long seed) {
        long acc = seed;
        for (int i = 0; i < 6; i++) {
            acc += spin(acc);
        }
        return acc;
    }

    static long splitB(long seed) {
        long acc = seed;
        for (int i = 0; i < 3; i++) {
            acc += spin(acc);
        }
        return acc;
    }

    static long splitC(long seed) {
        return spin(seed);
    }

    static long recurse(int depth, long seed) {
        if (depth == 0) {
            return deepLeaf(seed);
        }
        return recurse(depth - 1, seed) + 1;
    }

    static long deepLeaf(long seed) {
        long acc = seed;
        for (int i = 0; i < 2_000_000; i++) {
            acc ^= acc << 13;
            acc ^= acc >>> 7;
            acc ^= acc << 17;
        }
        return acc;
    }

    interface Op {
        long apply(long x);
    }

    static final class Mix1 implements Op {
        public long apply(long x) {
            for (int i = 0; i < 2000; i++) {
                x = x * 31 + i;
            }
            return x;
        }
    }

    static final class Mix2 implements Op {
        public long apply(long x) {
            for (int i = 0; i < 2000; i++) {
                x = x * 37 + (i ^ 5);
            }
            return x;
        }
    }

    static final class Mix3 implements Op {
        public long apply(long x) {
            for (int i = 0; i < 2000; i++) {
                x = (x ^ i) * 41;
            }
            return x;
        }
    }

    static final Op[] OPS = {new Mix1(), new Mix2(), new Mix3()};

    static long inlineInner(long x, int i) {
        return OPS[i % 3].apply(x) + 1;
    }

    static long inlineMiddle(long x, int i) {
        return inlineInner(x, i) ^ 5;
    }

    static long inlineOuter(long x, int i) {
        return inlineMiddle(x, i) + 3;
    }

    static void zipWork() {
        byte[] input = new byte[64 * 1024];
        for (int i = 0; i < input.length; i++) {
            input[i] = (byte) (i * 7 + (i >> 5));
        }
        byte[] output = new byte[128 * 1024];
        while (true) {
            Deflater deflater = new Deflater(6);
            deflater.setInput(input);
            deflater.finish();
            while (!deflater.finished()) {
                deflater.deflate(output);
            }
            deflater.end();
            CRC32 crc = new CRC32();
            crc.update(output, 0, output.length);
            sink += crc.getValue();
        }
    }

    static java.util.Set<String> only = java.util.Collections.emptySet();

    static Thread start(String name, Runnable body) {
        if (!only.isEmpty() && !only.contains(name)) {
            return null;
        }
        Thread thread = new Thread(body, name);
        thread.setDaemon(true);
        thread.start();
        return thread;
    }

    public static void main(String[] args) throws Exception {
        only = new java.util.HashSet<>(java.util.Arrays.asList(args));
        start("split-worker", () -> {
            long seed = 1;
            while (true) {
                seed = splitA(seed);
                seed = splitB(seed);
                seed = splitC(seed);
                sink += seed;
            }
        });
        start("deep-worker", () -> {
            while (true) {
                sink += recurse(200, sink);
            }
        });
        start("inline-worker", () -> {
            long x = 0;
            while (true) {
                for (int i = 0; i < 1_000; i++) {
                    x = inlineOuter(x, i);
                }
                sink += x;
            }
        });
        start("zip-worker", Workloads::zipWork);
        System.out.println("ready");
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
    }
}
