import java.util.zip.CRC32;
import java.util.zip.Deflater;

// Java workloads with known CPU splits and call chains, one named thread each:
//   split-worker   spends 60% / 30% / 10% of its time in splitA / splitB / splitC;
//   deep-worker    recurses 200 frames deep, then spins in a hot leaf;
//   inline-worker  calls tiny methods that C2 inlines (inlineOuter -> inlineMiddle -> inlineInner);
//   zip-worker     calls into native code (java.util.zip: Deflater and CRC32).
// Prints "ready" once every thread runs.
public class Workloads {
    static volatile long sink;

    // Work units are equal: the same loop, run 6, 3 and 1 times per round.
    static long spin(long seed) {
        long acc = seed;
        for (int i = 0; i < 200_000; i++) {
            acc = acc * 6364136223846793005L + 1442695040888963407L;
        }
        return acc;
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

    static int inlineInner(int x) {
        return x * 31 + 7;
    }

    static int inlineMiddle(int x) {
        return inlineInner(x) ^ (x >>> 3);
    }

    static int inlineOuter(int x) {
        return inlineMiddle(x) + inlineMiddle(x + 1);
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

    static Thread start(String name, Runnable body) {
        Thread thread = new Thread(body, name);
        thread.setDaemon(true);
        thread.start();
        return thread;
    }

    public static void main(String[] args) throws Exception {
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
            int x = 0;
            while (true) {
                for (int i = 0; i < 1_000_000; i++) {
                    x = inlineOuter(x + i);
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
