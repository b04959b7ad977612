import java.io.InputStream;
import java.util.function.LongSupplier;

// Generations of same-shape classes whose names carry the generation, so that a profiler that
// names a frame after memory another generation used to hold shows two tags in one stack:
//   gen-churn  defines generation g as NameChurn$G<g>Outer and NameChurn$G<g>Inner (the
//                      template classes below with "G0000" patched to the 4-digit generation) in
//                      a fresh class loader, runs Outer (which calls Inner) hot enough to be
//                      interpreted, compiled by C1 and C2 and OSR-compiled, drops it, and asks for
//                      a GC now and then so generations unload and their metaspace and code cache
//                      are reused by the next ones.
// Prints "ready" once the thread runs.
public class NameChurn {
    static volatile long sink;

    public static final class G0000Inner {
        public static long spin(long seed) {
            long acc = seed;
            for (int i = 0; i < 20_000; i++) {
                acc = acc * 6364136223846793005L + i;
            }
            return acc;
        }
    }

    public static final class G0000Outer implements LongSupplier {
        public long getAsLong() {
            long acc = 0;
            for (int i = 0; i < 40; i++) {
                acc += G0000Inner.spin(acc + i);
            }
            return acc;
        }
    }

    /// Defines one generation: both classes, Outer resolving Inner through this loader.
    static final class Generation extends ClassLoader {
        private final String innerName;
        private final Class<?> inner;
        final Class<?> outer;

        Generation(String tag, byte[] innerBytes, byte[] outerBytes) {
            super(NameChurn.class.getClassLoader());
            innerName = "NameChurn$" + tag + "Inner";
            byte[] in = patch(innerBytes, tag);
            inner = defineClass(innerName, in, 0, in.length);
            byte[] out = patch(outerBytes, tag);
            outer = defineClass("NameChurn$" + tag + "Outer", out, 0, out.length);
        }

        @Override
        protected Class<?> loadClass(String name, boolean resolve) throws ClassNotFoundException {
            if (name.equals(innerName)) {
                return inner;
            }
            return super.loadClass(name, resolve);
        }
    }

    /// Replaces every "G0000" in the class file with `tag` (same length: constant pool entries
    /// keep their sizes).
    static byte[] patch(byte[] bytes, String tag) {
        byte[] out = bytes.clone();
        byte[] from = "G0000".getBytes();
        byte[] to = tag.getBytes();
        for (int i = 0; i + from.length <= out.length; i++) {
            boolean match = true;
            for (int j = 0; j < from.length && match; j++) {
                match = out[i + j] == from[j];
            }
            if (match) {
                System.arraycopy(to, 0, out, i, to.length);
            }
        }
        return out;
    }

    static byte[] read(String name) throws Exception {
        try (InputStream in = NameChurn.class.getResourceAsStream(name)) {
            java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
            byte[] buffer = new byte[8192];
            for (int n; (n = in.read(buffer)) > 0; ) {
                out.write(buffer, 0, n);
            }
            return out.toByteArray();
        }
    }

    public static void main(String[] args) throws Exception {
        byte[] inner = read("NameChurn$G0000Inner.class");
        byte[] outer = read("NameChurn$G0000Outer.class");
        Thread thread = new Thread(() -> {
            try {
                for (int g = 1; ; g++) {
                    String tag = String.format("G%04d", g % 10_000);
                    Generation generation = new Generation(tag, inner, outer);
                    LongSupplier work = (LongSupplier) generation.outer.getDeclaredConstructor().newInstance();
                    // About 20-60 ms per generation: interpreted first, then C1, C2 and OSR code.
                    for (int round = 0; round < 30; round++) {
                        sink += work.getAsLong();
                    }
                    if (g % 20 == 0) {
                        System.gc();
                    }
                }
            } catch (ReflectiveOperationException e) {
                throw new RuntimeException(e);
            }
        }, "gen-churn");
        thread.setDaemon(true);
        thread.start();
        System.out.println("ready");
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
    }
}
