import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.zip.Deflater;

/* zlib state in malloc held by Java objects (tests/targets, issue 44): "start" begins a thread
 * that makes Deflaters at a steady pace, keeping one in ten for good; the others are dropped
 * and ended by the collector's cleaner in batches (System.gc() every 100). "count" prints how
 * many were made and kept. */
public class Deflaters {
  static final ArrayList<Deflater> kept = new ArrayList<>();
  static volatile long made;

  static void churn() {
    try {
      for (long i = 0; ; i++) {
        Deflater d = new Deflater(Deflater.BEST_COMPRESSION);
        d.setInput(new byte[16]);
        if (i % 10 == 0) synchronized (kept) { kept.add(d); }
        made = i + 1;
        if (i % 100 == 99) System.gc();
        Thread.sleep(2);
      }
    } catch (InterruptedException e) {
      return;
    }
  }

  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    System.out.println("ready " + ProcessHandle.current().pid());
    for (String line; (line = in.readLine()) != null && !line.equals("exit"); ) {
      if (line.equals("start")) {
        Thread t = new Thread(Deflaters::churn, "churn");
        t.setDaemon(true);
        t.start();
      } else if (line.equals("count")) {
        synchronized (kept) { System.out.println("made " + made + " kept " + kept.size()); }
      }
      System.out.println("done");
    }
  }
}
