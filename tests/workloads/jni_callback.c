// The JNI side of tests/java/JniCallback.java, built with -O2 -fomit-frame-pointer: half its time
// in its own frameless leaf, half in a Java method it calls back. Static functions keep their
// names in the symbol table; the empty asm after each call rules out tail calls.
#include <jni.h>

__attribute__((noinline)) static long native_spin(long units) {
    long sum = 0;
    for (volatile long i = 0; i < units; i++) {
        sum += i;
    }
    return sum;
}

__attribute__((noinline)) static long native_middle(JNIEnv *env, jclass cls, jmethodID callback,
                                                    int rounds) {
    long sum = 0;
    for (int i = 0; i < rounds; i++) {
        sum += native_spin(200000);
        sum += (*env)->CallStaticLongMethod(env, cls, callback, (jint)400000);
    }
    __asm__ volatile("" ::: "memory");
    return sum;
}

JNIEXPORT jlong JNICALL Java_JniCallback_nativeOuter(JNIEnv *env, jclass cls, jint rounds) {
    jmethodID callback = (*env)->GetStaticMethodID(env, cls, "javaCallback", "(I)J");
    long sum = native_middle(env, cls, callback, rounds);
    __asm__ volatile("" ::: "memory");
    return sum + 1;
}
