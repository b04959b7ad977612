import java.io.InputStream;
import java.util.function.LongSupplier;

// Class churn and deoptimization while being profiled:
//   churn-worker  defines a fresh copy of Churn$Generated in a new class loader, runs it, drops it,
//                 and asks for a GC now and then, so classes (and their compiled code) are
//                 unloaded and their memory reused all the time;
//   deopt-worker  runs a hot call site whose receiver type changes phase after phase, so compiled
//                 code is invalidated (uncommon traps) and recompiled.
// Prints "ready" once both threads run.
public class Churn {
    static volatile long sink;

    public static final class Generated implements LongSupplier {
        public long getAsLong() {
            long acc = System.nanoTime();
            for (int i = 0; i < 20_000; i++) {
                acc = acc * 31 + i;
            }
            return acc;
        }
    }

    static final class Loader extends ClassLoader {
        Loader() {
            super(Churn.class.getClassLoader());
        }

        Class<?> define(byte[] bytes) {
            return defineClass("Churn$Generated", bytes, 0, bytes.length);
        }
    }

    interface Shape {
        double area();
    }

    static final class Square implements Shape {
        final double side;
        Square(double side) { this.side = side; }
        public double area() { return side * side; }
    }

    static final class Circle implements Shape {
        final double radius;
        Circle(double radius) { this.radius = radius; }
        public double area() { return Math.PI * radius * radius; }
    }

    static final class Triangle implements Shape {
        final double base;
        Triangle(double base) { this.base = base; }
        public double area() { return base * base / 2; }
    }

    static double total(Shape[] shapes) {
        double sum = 0;
        for (Shape shape : shapes) {
            sum += shape.area();
        }
        return sum;
    }

    static Thread start(String name, Runnable body) {
        Thread thread = new Thread(body, name);
        thread.setDaemon(true);
        thread.start();
        return thread;
    }

    // InputStream.readAllBytes is JDK 9's; the classes run on JDK 8 too.
    static byte[] readAll(InputStream in) throws java.io.IOException {
        java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
        byte[] buffer = new byte[8192];
        for (int n; (n = in.read(buffer)) > 0; ) {
            out.write(buffer, 0, n);
        }
        return out.toByteArray();
    }

    public static void main(String[] args) throws Exception {
        byte[] bytes;
        try (InputStream in = Churn.class.getResourceAsStream("Churn$Generated.class")) {
            bytes = readAll(in);
        }
        start("churn-worker", () -> {
            try {
                for (long round = 0; ; round++) {
                    LongSupplier supplier = (LongSupplier) new Loader().define(bytes).getDeclaredConstructor().newInstance();
                    sink += supplier.getAsLong();
                    if (round % 200 == 0) {
                        System.gc();
                    }
                }
            } catch (ReflectiveOperationException e) {
                throw new RuntimeException(e);
            }
        });
        start("deopt-worker", () -> {
            Shape[][] phases = {
                {new Square(1), new Square(2)},
                {new Circle(1), new Circle(2)},
                {new Square(3), new Circle(3)},
                {new Triangle(1), new Triangle(2)},
                {new Square(1), new Circle(1), new Triangle(1)},
            };
            for (int phase = 0; ; phase++) {
                Shape[] shapes = phases[phase % phases.length];
                for (int i = 0; i < 2_000_000; i++) {
                    sink += (long) total(shapes);
                }
            }
        });
        System.out.println("ready");
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
    }
}
