// A command-driven JVM service (tests/integration/test_jit_frames.py): "warm" calls
// leakViaJni until the JIT has compiled it, "leak" makes it keep 50 blocks of 3000 bytes
// through its native method (leak_demo.c), "exit" ends it.
import java.io.BufferedReader;
import java.io.InputStreamReader;

public class LeakDemo {
    static { System.loadLibrary("leakdemo"); }

    static native void keep(int bytes, boolean really);

    static void leakViaJni(int bytes, boolean really) {
        keep(bytes, really);
    }

    public static void main(String[] args) throws Exception {
        System.out.println("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            if (line.equals("exit")) break;
            if (line.equals("warm")) {
                for (int i = 0; i < 200000; i++) leakViaJni(3000, false);
            } else if (line.equals("leak")) {
                for (int i = 0; i < 50; i++) leakViaJni(3000, true);
            }
            System.out.println("done");
        }
    }
}
