//! A master found through Redis Sentinel and followed across failovers.
//!
//! The Sentinels are asked in turn which node is the master of a name
//! (`SENTINEL GET-MASTER-ADDR-BY-NAME`), and that node is checked with `ROLE` (a
//! Sentinel may still name the old master for a moment). A call that finds the
//! connection broken or the node demoted (`READONLY`), or a connection on which
//! nothing has been answered for a whole timeout, sends the next call back to the
//! Sentinels; a `+switch-master` announcement from a Sentinel does the same at once.
//! Meanwhile calls fail as unavailable, so the limiter's failure policy answers.
//!
//! The search is written here rather than taken from redis-rs's `sentinel` module,
//! which cannot reach a master over TLS without checking its host name (Sentinels
//! announce IP addresses; certificates usually name hosts), nor bound the time one
//! search takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_core::{Clock, MonotonicClock};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, RedisResult, Value};

/// Builds the client of a master at (host, port) with the store's credentials and TLS.
pub(crate) type MasterClient =
    Box<dyn Fn(&str, u16) -> Result<redis::Client, crate::Error> + Send + Sync>;

/// Builds the client of one Sentinel with the Sentinels' credentials as they stand
/// now (a password file is read again for each new connection) and TLS.
pub(crate) type SentinelClient = Box<dyn Fn() -> Result<redis::Client, crate::Error> + Send + Sync>;

/// How a search says that a Sentinel refused the login (not the master); lower case,
/// as `first_contact` looks for it.
pub(crate) const SENTINEL_REFUSED_LOGIN: &str = "a sentinel refused the login";

/// After a search that found no master, calls within this long fail at once with its
/// error rather than asking the Sentinels again (a failover takes seconds).
const SEARCH_AGAIN_AFTER: Duration = Duration::from_millis(100);

/// The Sentinels of one master name and the connection to the master they name.
pub(crate) struct SentinelConn {
    name: String,
    /// Each Sentinel's address (for messages) and client.
    sentinels: Vec<(String, SentinelClient)>,
    master_client: MasterClient,
    db: i64,
    config: AsyncConnectionConfig,
    /// The master's: `config`, logging in with a password file's credentials when
    /// one is given.
    master_config: AsyncConnectionConfig,
    /// The longest one search may take (Sentinels, the master, its `ROLE`).
    search_timeout: Duration,
    /// A connection on which nothing has been answered for this long is given up.
    stall: Duration,
    clock: MonotonicClock,
    /// Whether the task that listens for `+switch-master` runs.
    watching: std::sync::atomic::AtomicBool,
    /// The last `+switch-master` heard: where the master went, and when (clock ms).
    /// A search that finds another master meanwhile (the old one, still saying it is
    /// one) is not believed for a while.
    announced: Mutex<Option<(String, u64)>>,
    current: Mutex<Option<Master>>,
    search: tokio::sync::Mutex<Search>,
}

/// The master in use.
#[derive(Clone)]
pub(crate) struct Master {
    addr: Arc<str>,
    conn: MultiplexedConnection,
    generation: u64,
    /// When this connection last answered (clock ms).
    answered: Arc<AtomicU64>,
}

/// What searches remember between them.
#[derive(Default)]
struct Search {
    generation: u64,
    /// The Sentinel that answered last (asked first next time), and its connection.
    first: usize,
    sentinel: Option<(usize, MultiplexedConnection)>,
    /// The last failed search: until when (clock us) its error stands.
    failed: Option<(u64, RedisError)>,
    /// Where the master was last found.
    last_addr: Option<Arc<str>>,
}

impl SentinelConn {
    /// `sentinels`: each Sentinel's address and a client for it (with the Sentinels'
    /// credentials and TLS); `master_client` makes the master's.
    pub(crate) fn new(
        name: String,
        sentinels: Vec<(String, SentinelClient)>,
        master_client: MasterClient,
        db: i64,
        connect_timeout: Duration,
        timeout: Duration,
        password_file: Option<super::credentials::FileCredentials>,
    ) -> SentinelConn {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(timeout));
        let master_config = match password_file {
            Some(file) => config.clone().set_credentials_provider(file),
            None => config.clone(),
        };
        SentinelConn {
            name,
            sentinels,
            master_client,
            db,
            config,
            master_config,
            search_timeout: connect_timeout,
            stall: timeout,
            clock: MonotonicClock::new(),
            watching: Default::default(),
            announced: Mutex::new(None),
            current: Mutex::new(None),
            search: Default::default(),
        }
    }

    pub(crate) fn db(&self) -> i64 {
        self.db
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_us() / 1000
    }

    /// The master's connection, searched for now if there is none: in a task of its
    /// own (one search at a time), so that a call's timeout does not cut a search
    /// short and leave every later call waiting on a new one.
    pub(crate) async fn get(self: &Arc<Self>) -> RedisResult<Master> {
        if let Some(m) = self.current.lock().unwrap().clone() {
            return Ok(m);
        }
        if !self.watching.swap(true, Ordering::Relaxed) {
            tokio::spawn(watch(Arc::downgrade(self)));
        }
        let me = self.clone();
        tokio::spawn(async move { me.find().await })
            .await
            .map_err(|e| RedisError::from(std::io::Error::other(format!("sentinel search: {e}"))))?
    }

    /// Sends one call on the master's connection (found first if need be), and
    /// learns from how it ended whether to ask the Sentinels again.
    pub(crate) async fn send<T, F>(
        self: &Arc<Self>,
        call: impl FnOnce(MultiplexedConnection) -> F,
    ) -> RedisResult<T>
    where
        F: std::future::Future<Output = RedisResult<T>>,
    {
        let master = self.get().await?;
        let conn = master.conn();
        let pending = Pending {
            sentinel: self,
            master,
            done: false,
        };
        let r = call(conn).await;
        pending.done(&r);
        r
    }

    async fn find(&self) -> RedisResult<Master> {
        let mut search = self.search.lock().await;
        if let Some(m) = self.current.lock().unwrap().clone() {
            return Ok(m);
        }
        if let Some((until, e)) = &search.failed {
            if self.clock.now_us() < *until {
                return Err(e.clone());
            }
        }
        let found = tokio::time::timeout(self.search_timeout, self.search(&mut search))
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "sentinel: no master {:?} found within {:?}",
                        self.name, self.search_timeout
                    ),
                )))
            });
        let found = found.and_then(|(addr, conn)| self.believed(addr).map(|addr| (addr, conn)));
        let (addr, conn) = match found {
            Ok(found) => found,
            Err(e) => {
                let until = self.clock.now_us() + SEARCH_AGAIN_AFTER.as_micros() as u64;
                search.failed = Some((until, e.clone()));
                return Err(e);
            }
        };
        search.failed = None;
        search.generation += 1;
        match search.last_addr.replace(addr.clone()) {
            None => {
                tracing::info!(master = %self.name, at = %addr, "redis sentinel: found the master")
            }
            Some(old) if old != addr => tracing::warn!(
                master = %self.name, from = %old, to = %addr,
                "redis sentinel: the master moved (failover); deciding on the new one"
            ),
            Some(_) => {}
        }
        let master = Master {
            addr,
            conn,
            generation: search.generation,
            answered: Arc::new(AtomicU64::new(self.now_ms())),
        };
        *self.current.lock().unwrap() = Some(master.clone());
        Ok(master)
    }

    /// `addr`, unless a Sentinel announced another master less than 30 s ago: then a
    /// failover is under way and the search found the old master.
    fn believed(&self, addr: Arc<str>) -> RedisResult<Arc<str>> {
        let mut announced = self.announced.lock().unwrap();
        match announced.as_ref() {
            Some((to, at)) if **to != *addr && self.now_ms().saturating_sub(*at) < 30_000 => {
                Err(RedisError::from((
                    ErrorKind::Server(redis::ServerErrorKind::MasterDown),
                    "a failover is under way",
                    format!("a Sentinel announced the master at {to}, the search found {addr}"),
                )))
            }
            _ => {
                *announced = None;
                Ok(addr)
            }
        }
    }

    /// Asks each Sentinel in turn, from the one that answered last, and connects to
    /// the first master named that says it is one.
    async fn search(&self, s: &mut Search) -> RedisResult<(Arc<str>, MultiplexedConnection)> {
        let n = self.sentinels.len();
        // Each Sentinel gets its share of the search's time, so that one that drops
        // packets (its node gone, its address still listed) cannot use it all up; the
        // whole stays within the search's bound, a little short of the first PING's,
        // so that its own error, not a bare timeout, is what a caller sees.
        let per = (self.search_timeout * 9 / 10) / n as u32;
        let mut problems = Vec::new();
        let (mut answered, mut unknown, mut kind, mut sentinel_login) = (0, 0, None, false);
        for i in 0..n {
            let at = (s.first + i) % n;
            let sentinel = self.sentinels[at].0.clone();
            let attempt = async {
                let named = self.ask(s, at).await.map_err(|e| (true, e))?;
                match named {
                    None => Ok(None),
                    Some((host, port)) => match self.open(&host, port).await {
                        Ok(conn) => Ok(Some((address(&host, port), conn))),
                        Err(e) => Err((false, e).with_master(&host, port)),
                    },
                }
            };
            let outcome = tokio::time::timeout(per, attempt)
                .await
                .unwrap_or_else(|_| {
                    Err((
                        true,
                        RedisError::from(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no answer within {per:?}"),
                        )),
                    ))
                });
            match outcome {
                Ok(Some((addr, conn))) => {
                    s.first = at;
                    return Ok((addr.into(), conn));
                }
                Ok(None) => {
                    answered += 1;
                    unknown += 1;
                    problems.push(format!(
                        "sentinel {sentinel}: no master named {:?}",
                        self.name
                    ));
                }
                Err((from_sentinel, e)) => {
                    answered += usize::from(!from_sentinel);
                    sentinel_login |= from_sentinel
                        && (e.kind() == ErrorKind::AuthenticationFailed
                            || e.code() == Some("NOAUTH"));
                    kind = kind.or(significant(&e));
                    problems.push(format!("sentinel {sentinel}: {e}"));
                }
            }
            // The next search starts past a Sentinel that failed.
            if s.first == at {
                s.first = (at + 1) % n;
            }
        }
        if unknown > 0 && unknown == answered {
            return Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no Sentinel knows this master name",
                format!("{:?}", self.name),
            )));
        }
        let what = if sentinel_login {
            SENTINEL_REFUSED_LOGIN
        } else {
            "no master reached through the Sentinels"
        };
        Err(RedisError::from((
            kind.unwrap_or(ErrorKind::Io),
            what,
            problems.join("; "),
        )))
    }

    /// What Sentinel `at` names as the master (`None`: it knows no such name).
    async fn ask(&self, s: &mut Search, at: usize) -> RedisResult<Option<(String, u16)>> {
        let mut conn = match &s.sentinel {
            Some((i, c)) if *i == at => c.clone(),
            _ => {
                let client = (self.sentinels[at].1)().map_err(|e| config_error("sentinel", e))?;
                let c = (client)
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?;
                s.sentinel = Some((at, c.clone()));
                c
            }
        };
        let named = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.name)
            .query_async::<Option<(String, u16)>>(&mut conn)
            .await;
        if named.is_err() {
            s.sentinel = None;
        }
        named
    }

    /// A connection to the node at (host, port), once it says it is the master.
    async fn open(&self, host: &str, port: u16) -> RedisResult<MultiplexedConnection> {
        let client =
            (self.master_client)(host, port).map_err(|e| config_error("master address", e))?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.master_config)
            .await?;
        let role = redis::cmd("ROLE").query_async::<Value>(&mut conn).await?;
        let is_master = match &role {
            Value::Array(v) => {
                matches!(
                    v.first(),
                    Some(Value::BulkString(b)) if b.as_slice() == b"master"
                ) || matches!(v.first(), Some(Value::SimpleString(s)) if s == "master")
            }
            _ => false,
        };
        if !is_master {
            return Err(RedisError::from((
                ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "not a master (yet): a failover is under way",
            )));
        }
        Ok(conn)
    }

    /// The master of `generation` failed a call with `e`, or (`None`) a call on it was
    /// dropped unanswered: the next call asks the Sentinels when the connection is
    /// broken, the node was demoted, or nothing has been answered on it for a whole
    /// timeout.
    pub(crate) fn failed(&self, m: &Master, e: Option<&RedisError>) {
        let lost = match e {
            Some(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error()
                    || matches!(
                        e.kind(),
                        ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                            | ErrorKind::Server(redis::ServerErrorKind::MasterDown)
                    )
            }
            None => {
                let quiet = self
                    .now_ms()
                    .saturating_sub(m.answered.load(Ordering::Relaxed));
                quiet >= self.stall.as_millis() as u64
            }
        };
        if lost {
            self.forget(
                m.generation,
                e.map_or("no answer".into(), |e| e.to_string()),
            );
        }
    }

    /// A call on `m` was answered.
    pub(crate) fn answered(&self, m: &Master) {
        m.answered.store(self.now_ms(), Ordering::Relaxed);
    }

    /// A Sentinel announced that the master is now at `to`.
    fn moved(&self, to: &str) {
        *self.announced.lock().unwrap() = Some((to.to_string(), self.now_ms()));
        let generation = match self.current.lock().unwrap().as_ref() {
            Some(m) if &*m.addr != to => m.generation,
            _ => return,
        };
        self.forget(
            generation,
            format!("a Sentinel announced the master at {to}"),
        );
    }

    /// Drops the master of `generation` (if it is still the one in use).
    pub(crate) fn forget(&self, generation: u64, why: String) {
        let mut current = self.current.lock().unwrap();
        if let Some(m) = current.as_ref().filter(|m| m.generation == generation) {
            tracing::info!(master = %self.name, at = %m.addr, why, "redis sentinel: asking the Sentinels again");
            *current = None;
        }
    }
}

/// Listens for `+switch-master` on one Sentinel after another while the store lives,
/// and drops the master a failover moved away from: the next call asks the Sentinels,
/// rather than deciding on the old master until it is demoted (what it admits
/// meanwhile is lost when it becomes a replica).
async fn watch(me: std::sync::Weak<SentinelConn>) {
    use futures_core::Stream;
    let mut at = 0;
    loop {
        let Some(s) = me.upgrade() else { return };
        let client = (s.sentinels[at % s.sentinels.len()].1)();
        let subscribed = tokio::time::timeout(s.search_timeout, async {
            let client = client.map_err(|e| config_error("sentinel", e))?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            RedisResult::Ok(pubsub)
        })
        .await;
        drop(s);
        let Ok(Ok(pubsub)) = subscribed else {
            at += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let mut messages = pubsub.into_on_message();
        loop {
            let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut messages).poll_next(cx));
            // Wakes once a second to see whether the store is gone.
            let msg = match tokio::time::timeout(Duration::from_secs(1), next).await {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(_) if me.strong_count() == 0 => return,
                Err(_) => continue,
            };
            let Some(s) = me.upgrade() else { return };
            // `<name> <old ip> <old port> <new ip> <new port>`
            let text = msg.get_payload::<String>().unwrap_or_default();
            let parts: Vec<&str> = text.split_whitespace().collect();
            if let [name, _, _, ip, port] = parts[..] {
                if name == s.name {
                    let to = address(ip, port.parse().unwrap_or(0));
                    s.moved(&to);
                }
            }
        }
        at += 1;
    }
}

impl Master {
    /// Its connection, to send a call on.
    pub(crate) fn conn(&self) -> MultiplexedConnection {
        self.conn.clone()
    }
}

/// Forgets the master when dropped before `done`: the call was cut off (its timeout)
/// before any answer.
struct Pending<'a> {
    sentinel: &'a SentinelConn,
    master: Master,
    done: bool,
}

impl Pending<'_> {
    /// The call ended with `r`.
    fn done<T>(mut self, r: &RedisResult<T>) {
        self.done = true;
        match r {
            Ok(_) => self.sentinel.answered(&self.master),
            // A reply that is an error is still an answer.
            Err(e) if e.kind() == ErrorKind::Extension || e.code().is_some() => {
                self.sentinel.answered(&self.master);
                self.sentinel.failed(&self.master, Some(e));
            }
            Err(e) => self.sentinel.failed(&self.master, Some(e)),
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.sentinel.failed(&self.master, None);
        }
    }
}

/// A failure of the master a Sentinel named, said as such.
trait WithMaster {
    fn with_master(self, host: &str, port: u16) -> Self;
}

impl WithMaster for (bool, RedisError) {
    fn with_master(self, host: &str, port: u16) -> Self {
        let (from_sentinel, e) = self;
        let said = format!("the master it names, {}: {e}", address(host, port));
        let e = match e.kind() {
            // Keep what makes it a configuration error.
            kind @ (ErrorKind::AuthenticationFailed | ErrorKind::Server(_)) => {
                RedisError::from((kind, "master", said))
            }
            _ if e.code() == Some("NOAUTH") => e,
            _ => RedisError::from(std::io::Error::other(said)),
        };
        (from_sentinel, e)
    }
}

/// The error kind worth reporting from a search (a refused login over a refused
/// connection), if `e` has one.
fn significant(e: &RedisError) -> Option<ErrorKind> {
    (!e.is_io_error()).then(|| e.kind())
}

/// `host:port`, with an IPv6 host in brackets.
/// A client that could not be made (`what`: whose), as the connection's error.
fn config_error(what: &'static str, e: crate::Error) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, what, e.to_string()))
}

pub(crate) fn address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
