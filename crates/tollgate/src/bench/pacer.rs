//! Releasing open-loop calls at their due times, to tens of microseconds.
//!
//! tokio's timers fire to the millisecond. For server round trips of
//! milliseconds that is fine, but a `--local` call takes tens of
//! microseconds: at 30 000 calls/s, the 30 calls due in one millisecond
//! would all leave at the same instant and queue behind each other, and
//! the latency measured would be the load generator's clumping, not the
//! path's. So in open loop the local benches are paced by a thread of their
//! own: it sleeps (`std::thread::sleep`, a high-resolution timer) until the
//! next due time, releases every call due by then, and records how late it
//! was (the pacing lag, reported with the results so a run can show its
//! load was offered as asked).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::time::Instant;

/// One gate per caller: the pacing thread sends on caller `i`'s gate when
/// its next call is due, and drops the senders when the run is over (a
/// caller still gets the calls released before that).
#[derive(Debug)]
pub(super) struct Pacer {
    gates: Vec<tokio::sync::Mutex<UnboundedReceiver<()>>>,
    /// How late calls were released, in microseconds.
    lag: Arc<Mutex<Histogram<u64>>>,
}

/// The open-loop schedule: call `n` of the whole run is caller
/// `n % callers`'s, due `n / rate` seconds after `start` (every caller's
/// first at `start` in a herd), until `end`: as `RunContext::due` spreads
/// them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    pub start: Instant,
    pub end: Instant,
    pub rate: f64,
    pub callers: usize,
    pub herd: bool,
}

impl Schedule {
    fn due(&self, n: u64) -> Option<Instant> {
        if self.herd && n < self.callers as u64 {
            return Some(self.start);
        }
        let due = self
            .start
            .checked_add(Duration::try_from_secs_f64(n as f64 / self.rate).ok()?)?;
        (due < self.end).then_some(due)
    }
}

impl Pacer {
    /// Starts the pacing thread for `schedule`.
    pub fn start(schedule: Schedule) -> std::io::Result<Pacer> {
        let (senders, gates): (Vec<_>, Vec<_>) = (0..schedule.callers)
            .map(|_| {
                let (sender, receiver) = unbounded_channel();
                (sender, tokio::sync::Mutex::new(receiver))
            })
            .unzip();
        let lag = Arc::new(Mutex::new(super::new_histogram()));
        let thread_lag = Arc::clone(&lag);
        std::thread::Builder::new()
            .name("bench-pacer".into())
            .spawn(move || pace(schedule, &senders, &thread_lag))?;
        Ok(Pacer { gates, lag })
    }

    /// Waits until caller `index`'s next call is due; false once the run
    /// is over.
    pub async fn wait(&self, index: usize) -> bool {
        // Each caller waits on its own gate only: the lock is never
        // contended.
        self.gates[index].lock().await.recv().await.is_some()
    }

    /// How late the calls were released, in microseconds.
    pub fn lag(&self) -> Histogram<u64> {
        self.lag
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn pace(schedule: Schedule, gates: &[UnboundedSender<()>], lag: &Mutex<Histogram<u64>>) {
    let mut lags = super::new_histogram();
    let mut n: u64 = 0;
    while let Some(due) = schedule.due(n) {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
            continue;
        }
        // Due: it leaves now, and so does every call due by now.
        let late = now.duration_since(due).as_micros();
        let _ = lags.record(u64::try_from(late).unwrap_or(u64::MAX));
        // Callers are at most a usize: `n % callers` fits. A caller gone
        // (its run failed) needs no more calls.
        let _ = gates[(n % schedule.callers as u64) as usize].send(());
        n += 1;
    }
    *lag.lock().unwrap_or_else(PoisonError::into_inner) = lags;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_call_of_the_schedule_is_released_once_in_caller_order_then_the_gates_close() {
        let start = Instant::now();
        let schedule = Schedule {
            start,
            end: start + Duration::from_millis(50),
            rate: 2_000.0,
            callers: 3,
            herd: false,
        };
        let pacer = Arc::new(Pacer::start(schedule).expect("thread"));
        let mut callers = Vec::new();
        for index in 0..3 {
            let pacer = Arc::clone(&pacer);
            callers.push(tokio::spawn(async move {
                let mut calls = 0u64;
                while pacer.wait(index).await {
                    calls += 1;
                }
                calls
            }));
        }
        let mut total = 0;
        for (index, caller) in callers.into_iter().enumerate() {
            let calls = caller.await.expect("caller");
            // 100 calls due in 50 ms, dealt round robin from caller 0.
            let expected = if index == 0 { 34 } else { 33 };
            assert_eq!(calls, expected, "caller {index}");
            total += calls;
        }
        assert_eq!(total, 100);
        assert_eq!(pacer.lag().len(), 100);
    }
}
