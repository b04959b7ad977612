import java.util.concurrent.atomic.LongAdder;

// The allocation-heavy workload of `cargo xtask bench` (section 8). Prints "ready" first.
//
//   Alloc THREADS WORK
//       THREADS workers allocate short-lived byte arrays in a loop: small ones (32 to 96 bytes,
//       allocated in the thread's TLAB, so HotSpot reports only each TLAB refill) and, after
//       every LARGE_EVERY small ones, one of LARGE_LENGTH bytes (outside the TLAB when it does not
//       fit in what is left of it: about half of them at the JVM's TLAB sizes). Each
//       small array is written and then hashed WORK rounds, so that the allocation rate is that
//       of a program doing something with what it allocates (the bench picks WORK for about
//       1 GB/s on its machine) and the workers keep their CPUs busy. Prints
//       "ops BYTES NANOS" every 100 ms: the bytes allocated so far (array headers included, as
//       the heap counts them) and System.nanoTime, taken together so that a rate between two
//       reports is exact.
public class Alloc {
    // Small arrays' lengths: SMALL_MIN + 0..63 bytes of payload, 16 bytes of header.
    static final int SMALL_MIN = 16;
    static final int LARGE_LENGTH = 256 << 10;
    // About 3% of the bytes are large arrays: one per 2^17 small ones (8 MiB at 64 bytes each
    // on average).
    static final int LARGE_EVERY = 1 << 17;
    // Allocated arrays stay reachable for this many further allocations of the thread (so that
    // none can be optimized away, and all die young).
    static final int LIVE = 1024;
    // Small arrays per update of the shared byte count.
    static final int BATCH = 256;

    static volatile long sink;

    public static void main(String[] args) throws Exception {
        int threads = Integer.parseInt(args[0]);
        int work = Integer.parseInt(args[1]);
        LongAdder bytes = new LongAdder();
        for (int t = 0; t < threads; t++) {
            long seed = 0x9E3779B97F4A7C15L * (t + 1);
            Thread thread = new Thread(() -> allocate(seed, work, bytes), "alloc-" + t);
            thread.setDaemon(true);
            thread.start();
        }
        System.out.println("ready");
        System.out.flush();
        while (true) {
            Thread.sleep(100);
            long count = bytes.sum();
            long now = System.nanoTime();
            System.out.println("ops " + count + " " + now);
            System.out.flush();
        }
    }

    // The heap size of a byte array: 16 bytes of header and length, rounded up to 8 bytes.
    static long arrayBytes(int length) {
        return (16L + length + 7) & ~7L;
    }

    static void allocate(long seed, int work, LongAdder total) {
        Object[] live = new Object[LIVE];
        long s = seed;
        int slot = 0;
        int small = 0;
        while (true) {
            long bytes = 0;
            for (int i = 0; i < BATCH; i++) {
                s ^= s << 13;
                s ^= s >>> 7;
                s ^= s << 17;
                int length = SMALL_MIN + (int) (s & 63);
                byte[] array = new byte[length];
                array[0] = (byte) s;
                array[length - 1] = (byte) (s >>> 8);
                live[slot++ & (LIVE - 1)] = array;
                bytes += arrayBytes(length);
                s = hash(s, array, work);
            }
            small += BATCH;
            if (small >= LARGE_EVERY) {
                small = 0;
                byte[] large = new byte[LARGE_LENGTH];
                large[(int) (s & (LARGE_LENGTH - 1))] = (byte) s;
                live[slot++ & (LIVE - 1)] = large;
                bytes += arrayBytes(LARGE_LENGTH);
            }
            total.add(bytes);
            if (s == 0) {
                sink = s;
            }
        }
    }

    // WORK rounds of mixing the array's first and last bytes into the state.
    static long hash(long s, byte[] array, int work) {
        long h = s;
        int last = array.length - 1;
        for (int k = 0; k < work; k++) {
            h ^= array[k & 1] * 0x100000001B3L + array[last];
            h ^= h << 13;
            h ^= h >>> 7;
            h ^= h << 17;
        }
        return h;
    }
}
