// Golden vectors for tollgate's smooth-bursty and smooth-warmup policies, produced by
// the real Guava RateLimiter (Debian's libguava-java) on a virtual clock.
//
// This class lives in Guava's package to reach the package-private factories that take
// a SleepingStopwatch, so time is the trace's, not the system's.
//
// Output CSV: spec,t_us,cost,op,allowed,wait_us
//   op=try      -> tryAcquire(cost, 0, MICROSECONDS); wait_us is 0
//   op=acquire  -> reserve(cost) (what acquire(cost) sleeps for); wait_us is that wait
package com.google.common.util.concurrent;

import java.util.Random;
import java.util.concurrent.TimeUnit;

public final class GoldenVectors {
  static final class VirtualStopwatch extends RateLimiter.SleepingStopwatch {
    long micros;

    @Override
    protected long readMicros() {
      return micros;
    }

    @Override
    protected void sleepMicrosUninterruptibly(long m) {
      // Virtual time: the trace decides when the next request arrives.
    }
  }

  /** One scenario: a tollgate spec and the equivalent Guava limiter. */
  static void scenario(String spec, long count, long periodUs, double maxBurstSeconds,
      long warmupUs, double coldFactor, long seed, int rows) {
    // Same double operations as tollgate's Rate::per_second.
    double pps = (double) count * 1e6 / (double) periodUs;
    VirtualStopwatch clock = new VirtualStopwatch();
    RateLimiter limiter;
    if (warmupUs > 0) {
      limiter = RateLimiter.create(pps, warmupUs, TimeUnit.MICROSECONDS, coldFactor, clock);
    } else {
      limiter = new SmoothRateLimiter.SmoothBursty(clock, maxBurstSeconds);
      limiter.setRate(pps);
    }
    Random random = new Random(seed);
    long interval = (long) (1e6 / pps);
    long t = 0;
    for (int i = 0; i < rows; i++) {
      int r = random.nextInt(100);
      if (r < 30) {
        // same instant
      } else if (r < 95) {
        t += (long) (random.nextDouble() * 3 * interval);
      } else {
        t += 20L * interval + random.nextInt(1_000_000);
      }
      clock.micros = t;
      int cost = 1 + random.nextInt(random.nextInt(10) == 0 ? 20 : 3);
      boolean acquire = random.nextBoolean();
      if (acquire) {
        long wait = limiter.reserve(cost);
        System.out.println(spec + "," + t + "," + cost + ",acquire,1," + wait);
      } else {
        boolean ok = limiter.tryAcquire(cost, 0, TimeUnit.MICROSECONDS);
        System.out.println(spec + "," + t + "," + cost + ",try," + (ok ? 1 : 0) + ",0");
      }
    }
  }

  public static void main(String[] args) {
    System.out.println("spec,t_us,cost,op,allowed,wait_us");
    int rows = 400;
    scenario("\"smooth-bursty:rate=2/s\"", 2, 1_000_000, 1.0, 0, 0, 1, rows);
    scenario("\"smooth-bursty:rate=10/s\"", 10, 1_000_000, 1.0, 0, 0, 2, rows);
    scenario("\"smooth-bursty:rate=3/s\"", 3, 1_000_000, 1.0, 0, 0, 3, rows);
    scenario("\"smooth-bursty:rate=7/m\"", 7, 60_000_000, 1.0, 0, 0, 4, rows);
    scenario("\"smooth-bursty:rate=1000/s,max-burst=3s\"", 1000, 1_000_000, 3.0, 0, 0, 5, rows);
    scenario("\"smooth-bursty:rate=5/250ms,max-burst=250ms\"", 5, 250_000, 0.25, 0, 0, 6, rows);
    scenario("\"smooth-warmup:rate=2/s,warmup=4s\"", 2, 1_000_000, 0, 4_000_000, 3.0, 7, rows);
    scenario("\"smooth-warmup:rate=10/s,warmup=1s\"", 10, 1_000_000, 0, 1_000_000, 3.0, 8, rows);
    scenario("\"smooth-warmup:rate=3/s,warmup=2s,cold-factor=2.5\"", 3, 1_000_000, 0, 2_000_000, 2.5, 9, rows);
    scenario("\"smooth-warmup:rate=7/m,warmup=1m\"", 7, 60_000_000, 0, 60_000_000, 3.0, 10, rows);
    scenario("\"smooth-warmup:rate=1000/s,warmup=500ms,cold-factor=5\"", 1000, 1_000_000, 0, 500_000, 5.0, 11, rows);
  }
}
