//! What a request brings to an adaptive limiter (its priority) and what it takes
//! away (an outcome when its permit ends, or the reason it was shed).

use std::fmt;

/// How much a request matters when the limit is reached: higher is served first.
///
/// Any value 0–255; three are named. Priorities below [`Priority::NORMAL`] are
/// *sheddable*: such a request never waits while a request of higher priority is
/// waiting (it is rejected as it arrives, and a waiting one is rejected as soon as a
/// more important request starts to wait), so low-value work absorbs the shedding.
///
/// ```
/// use tollgate_core::adaptive::Priority;
/// assert!(Priority::CRITICAL > Priority::NORMAL);
/// assert_eq!("sheddable".parse::<Priority>().unwrap(), Priority::SHEDDABLE);
/// assert_eq!("150".parse::<Priority>().unwrap(), Priority(150));
/// assert!("urgent".parse::<Priority>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Priority(pub u8);

impl Priority {
    /// Work that may be dropped first (prefetches, batch jobs, retries).
    pub const SHEDDABLE: Priority = Priority(0);
    /// The default.
    pub const NORMAL: Priority = Priority(100);
    /// Work that must get through (checkout, health of the business).
    pub const CRITICAL: Priority = Priority(200);

    /// Whether this priority is sheddable (below [`Priority::NORMAL`]).
    pub fn is_sheddable(self) -> bool {
        self < Priority::NORMAL
    }
}

impl Default for Priority {
    fn default() -> Self {
        Priority::NORMAL
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Priority::SHEDDABLE => f.write_str("sheddable"),
            Priority::NORMAL => f.write_str("normal"),
            Priority::CRITICAL => f.write_str("critical"),
            Priority(n) => write!(f, "{n}"),
        }
    }
}

/// A priority that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid priority '{0}': expected critical, normal, sheddable or a number 0-255")]
pub struct PriorityError(pub String);

impl std::str::FromStr for Priority {
    type Err = PriorityError;
    fn from_str(s: &str) -> Result<Self, PriorityError> {
        match s.trim() {
            "critical" => Ok(Priority::CRITICAL),
            "normal" => Ok(Priority::NORMAL),
            "sheddable" => Ok(Priority::SHEDDABLE),
            n => n
                .parse::<u8>()
                .map(Priority)
                .map_err(|_| PriorityError(s.to_string())),
        }
    }
}

/// How the work under a permit ended: the only input that moves an adaptive limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The work succeeded and took this long (microseconds): a latency sample.
    Success {
        /// Time from admission to the end of the work, in microseconds.
        latency_us: u64,
    },
    /// The work failed for lack of capacity: a timeout, an overload answer from
    /// upstream (503, 429, `RESOURCE_EXHAUSTED`). Moves the limit down.
    Dropped,
    /// The outcome says nothing about capacity (a client error, a cancelled request).
    /// A permit dropped without a report counts as ignored.
    Ignored,
}

/// Why an adaptive limiter turned a request away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Shed {
    /// Every permit is in use and the request would not wait (`try_acquire`).
    #[error("overloaded: all {limit} permits are in use")]
    Busy {
        /// The limit when the request arrived.
        limit: u32,
    },
    /// The queue holds its maximum number of waiters, none less important.
    #[error("overloaded: the queue is full ({queue} waiting)")]
    QueueFull {
        /// The queue's bound.
        queue: u32,
    },
    /// The request waited as long as the queueing-delay target allows: waiting has
    /// become the latency, so it is rejected now rather than time out later.
    #[error("overloaded: queued {waited_us} us, past the queueing-delay target")]
    QueueDelay {
        /// How long it waited, in microseconds.
        waited_us: u64,
    },
    /// The request waited as long as its caller allowed (`max_wait`).
    #[error("overloaded: queued {waited_us} us, the longest the caller would wait")]
    MaxWait {
        /// How long it waited, in microseconds.
        waited_us: u64,
    },
    /// A sheddable request gave way to a more important one that has to wait, or a
    /// more important arrival took its place in a full queue.
    #[error("shed: a more important request needed the capacity")]
    Outranked,
}
