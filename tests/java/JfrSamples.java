import java.io.BufferedWriter;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Instant;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;

import jdk.jfr.consumer.RecordedClass;
import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedFrame;
import jdk.jfr.consumer.RecordedMethod;
import jdk.jfr.consumer.RecordedStackTrace;
import jdk.jfr.consumer.RecordedThread;
import jdk.jfr.consumer.RecordingFile;

// Prints every jdk.ExecutionSample of a JFR recording, one line each, with the JDK's own
// parser (what `jfr print` uses): what tests/tests/real_apps/ compares the daemon with.
// `jfr print --json` writes each frame's class loader and module in full (kilobytes per frame),
// too much for thousands of deep stacks; this keeps what the comparison needs.
//
// Line: <epoch nanos> TAB <truncated 0|1> TAB <thread name> {TAB <frame type> | <class.method>}
// frames innermost first; frame type as JFR names it ("JIT compiled", "Inlined", ...).
//
// With `--alloc` after the file, also every jdk.ObjectAllocationInNewTLAB and
// jdk.ObjectAllocationOutsideTLAB event, one line each (the first field tells them apart):
// alloc TAB <epoch nanos> TAB <in_new_tlab|outside_tlab> TAB <bytes> TAB <class> TAB
// <truncated 0|1> TAB <thread name> {TAB <frame type> | <class.method>}
// bytes: the new TLAB's size (`tlabSize`) for in_new_tlab, the object's (`allocationSize`) for
// outside_tlab, the weights the daemon's alloc profiles give these events; class in Java form
// (`java.lang.String`, `byte[]`, `java.lang.Object[][]`); only the innermost ALLOC_FRAMES
// frames (the comparison needs the innermost Java method; tens of thousands of deep stacks
// would be megabytes).
//
// With `--lock`, also every jdk.JavaMonitorEnter and jdk.ThreadPark event, one line each:
// lock TAB <epoch nanos at its end> TAB <monitor_enter|park> TAB <duration nanos> TAB <class>
// TAB <truncated 0|1> TAB <thread name> {TAB <frame type> | <class.method>}
// class: the monitor's (`monitorClass`) or the object parked on's (`parkedClass`, often none);
// only the innermost LOCK_FRAMES frames (enough to get past the lock's own classes to the
// method that took it).
public class JfrSamples {
    static final int ALLOC_FRAMES = 8;
    static final int LOCK_FRAMES = 16;
    // The parser shares a stack trace's and a class's object among the events that refer to
    // it (one constant of the recording): each is formatted once.
    static final Map<RecordedStackTrace, String> STACKS = new IdentityHashMap<>();
    static final Map<RecordedStackTrace, String> ALLOC_STACKS = new IdentityHashMap<>();
    static final Map<RecordedStackTrace, String> LOCK_STACKS = new IdentityHashMap<>();
    static final Map<RecordedClass, String> CLASSES = new IdentityHashMap<>();

    public static void main(String[] args) throws Exception {
        List<String> options = List.of(args).subList(1, args.length);
        boolean alloc = options.contains("--alloc");
        boolean lock = options.contains("--lock");
        PrintWriter out = new PrintWriter(new BufferedWriter(
                new OutputStreamWriter(System.out, StandardCharsets.UTF_8), 1 << 16));
        try (RecordingFile file = new RecordingFile(Path.of(args[0]))) {
            while (file.hasMoreEvents()) {
                RecordedEvent event = file.readEvent();
                String type = event.getEventType().getName();
                if (type.equals("jdk.ExecutionSample")) {
                    out.println(executionSample(event));
                } else if (alloc && type.equals("jdk.ObjectAllocationInNewTLAB")) {
                    out.println(allocation(event, "in_new_tlab", event.getLong("tlabSize")));
                } else if (alloc && type.equals("jdk.ObjectAllocationOutsideTLAB")) {
                    out.println(allocation(event, "outside_tlab", event.getLong("allocationSize")));
                } else if (lock && type.equals("jdk.JavaMonitorEnter")) {
                    out.println(lockWait(event, "monitor_enter", event.getClass("monitorClass")));
                } else if (lock && type.equals("jdk.ThreadPark")) {
                    out.println(lockWait(event, "park", event.getClass("parkedClass")));
                }
            }
        }
        out.flush();
    }

    static String executionSample(RecordedEvent event) {
        RecordedThread thread = event.getThread("sampledThread");
        RecordedStackTrace stack = event.getStackTrace();
        StringBuilder line = new StringBuilder();
        line.append(nanos(event.getStartTime())).append('\t');
        line.append(stack != null && stack.isTruncated() ? '1' : '0').append('\t');
        line.append(clean(thread == null ? "" : thread.getJavaName()));
        line.append(frames(STACKS, stack, Integer.MAX_VALUE));
        return line.toString();
    }

    static String allocation(RecordedEvent event, String kind, long bytes) {
        RecordedThread thread = event.getThread();
        RecordedStackTrace stack = event.getStackTrace();
        RecordedClass objectClass = event.getClass("objectClass");
        StringBuilder line = new StringBuilder("alloc\t");
        line.append(nanos(event.getStartTime())).append('\t');
        line.append(kind).append('\t').append(bytes).append('\t');
        line.append(objectClass == null ? "[no class]"
                : CLASSES.computeIfAbsent(objectClass, c -> clean(javaName(c.getName()))));
        line.append('\t').append(stack != null && stack.isTruncated() ? '1' : '0').append('\t');
        line.append(clean(thread == null ? "" : thread.getJavaName()));
        line.append(frames(ALLOC_STACKS, stack, ALLOC_FRAMES));
        return line.toString();
    }

    static String lockWait(RecordedEvent event, String kind, RecordedClass objectClass) {
        RecordedThread thread = event.getThread();
        RecordedStackTrace stack = event.getStackTrace();
        StringBuilder line = new StringBuilder("lock\t");
        line.append(nanos(event.getEndTime())).append('\t');
        line.append(kind).append('\t').append(event.getDuration().toNanos()).append('\t');
        line.append(objectClass == null ? "[no class]"
                : CLASSES.computeIfAbsent(objectClass, c -> clean(javaName(c.getName()))));
        line.append('\t').append(stack != null && stack.isTruncated() ? '1' : '0').append('\t');
        line.append(clean(thread == null ? "" : thread.getJavaName()));
        line.append(frames(LOCK_STACKS, stack, LOCK_FRAMES));
        return line.toString();
    }

    static long nanos(Instant at) {
        return at.getEpochSecond() * 1_000_000_000L + at.getNano();
    }

    // {TAB <frame type> | <class.method>} of the innermost `limit` frames, formatted once per
    // stack trace (`formatted`).
    static String frames(Map<RecordedStackTrace, String> formatted, RecordedStackTrace stack,
            int limit) {
        if (stack == null) {
            return "";
        }
        return formatted.computeIfAbsent(stack, s -> {
            StringBuilder line = new StringBuilder();
            appendFrames(line, s, limit);
            return line.toString();
        });
    }

    static void appendFrames(StringBuilder line, RecordedStackTrace stack, int limit) {
        List<RecordedFrame> frames = stack.getFrames();
        for (RecordedFrame frame : frames.subList(0, Math.min(limit, frames.size()))) {
            RecordedMethod method = frame.getMethod();
            line.append('\t').append(frame.getType()).append('|');
            if (method == null) {
                line.append("[no method]");
            } else {
                line.append(clean(method.getType().getName())).append('.')
                        .append(clean(method.getName()));
            }
        }
    }

    // A class name as JFR's consumer gives it (`java.lang.String`, arrays as descriptors:
    // `[B`, `[[Ljava.lang.Object;`) -> its Java form (`byte[]`, `java.lang.Object[][]`).
    static String javaName(String name) {
        int dimensions = 0;
        while (dimensions < name.length() && name.charAt(dimensions) == '[') {
            dimensions++;
        }
        if (dimensions == 0) {
            return name;
        }
        String element = name.substring(dimensions);
        switch (element) {
            case "Z": element = "boolean"; break;
            case "B": element = "byte"; break;
            case "C": element = "char"; break;
            case "S": element = "short"; break;
            case "I": element = "int"; break;
            case "J": element = "long"; break;
            case "F": element = "float"; break;
            case "D": element = "double"; break;
            default:
                if (element.startsWith("L") && element.endsWith(";")) {
                    element = element.substring(1, element.length() - 1);
                }
        }
        return element + "[]".repeat(dimensions);
    }

    static String clean(String s) {
        return s == null ? "" : s.replace('\t', ' ').replace('\n', ' ').replace('|', '/');
    }
}
