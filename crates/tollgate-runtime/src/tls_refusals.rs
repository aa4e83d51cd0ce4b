//! Refused TLS handshakes on a listener: why each failed, counted by reason
//! (`tollgate_tls_handshake_failures_total{listener,reason}`), and logged with the
//! peer and the reason at most once a second per listener, so that a scanner or a
//! client with the wrong CA cannot flood the log.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::{AlertDescription, CertificateError};
use tokio::time::Instant;

/// Why a handshake failed: the `reason` label's values, in [`Refusals::counts`]'
/// order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not done within the header timeout.
    Timeout,
    /// The bytes were not TLS (plain HTTP to a TLS port, a scanner).
    NotTls,
    /// Mutual TLS: the client sent no certificate.
    NoClientCertificate,
    /// Mutual TLS: the client's certificate is not signed by `client_ca_file`.
    ClientCertificateUnknownCa,
    /// Mutual TLS: the client's certificate is refused for another reason (expired,
    /// not yet valid, revoked, malformed).
    ClientCertificateInvalid,
    /// The client refused the listener's certificate (it does not trust its CA, or
    /// the name it asked for is not on it): it said so with an alert.
    RefusedByClient,
    /// No protocol version, cipher suite or ALPN protocol in common.
    Incompatible,
    /// The client closed or reset the connection mid-handshake (a TCP health check
    /// of a load balancer does, at every check): counted, logged at debug only.
    Closed,
    /// Anything else the TLS library refused.
    Other,
}

impl Reason {
    /// Every reason, in label order: the order of declaration (`reason as usize`
    /// indexes it).
    pub const ALL: [Reason; 9] = [
        Reason::Timeout,
        Reason::NotTls,
        Reason::NoClientCertificate,
        Reason::ClientCertificateUnknownCa,
        Reason::ClientCertificateInvalid,
        Reason::RefusedByClient,
        Reason::Incompatible,
        Reason::Closed,
        Reason::Other,
    ];

    /// Its `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Timeout => "timeout",
            Reason::NotTls => "not_tls",
            Reason::NoClientCertificate => "no_client_certificate",
            Reason::ClientCertificateUnknownCa => "client_certificate_unknown_ca",
            Reason::ClientCertificateInvalid => "client_certificate_invalid",
            Reason::RefusedByClient => "refused_by_client",
            Reason::Incompatible => "incompatible",
            Reason::Closed => "closed",
            Reason::Other => "other",
        }
    }

    /// The reason of a failed handshake's error.
    pub fn of(e: &std::io::Error) -> Reason {
        let Some(tls) = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) else {
            return Reason::Closed;
        };
        match tls {
            rustls::Error::InvalidMessage(_)
            | rustls::Error::InappropriateMessage { .. }
            | rustls::Error::InappropriateHandshakeMessage { .. } => Reason::NotTls,
            rustls::Error::NoCertificatesPresented => Reason::NoClientCertificate,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                Reason::ClientCertificateUnknownCa
            }
            rustls::Error::InvalidCertificate(_) => Reason::ClientCertificateInvalid,
            rustls::Error::AlertReceived(AlertDescription::ProtocolVersion)
            | rustls::Error::AlertReceived(AlertDescription::HandshakeFailure)
            | rustls::Error::AlertReceived(AlertDescription::NoApplicationProtocol) => {
                Reason::Incompatible
            }
            rustls::Error::AlertReceived(_) => Reason::RefusedByClient,
            rustls::Error::PeerIncompatible(_) | rustls::Error::NoApplicationProtocol => {
                Reason::Incompatible
            }
            _ => Reason::Other,
        }
    }
}

/// How often a listener logs a refusal at most.
const LOG_EVERY: Duration = Duration::from_secs(1);

/// One listener's refused handshakes.
#[derive(Debug, Default)]
pub struct Refusals {
    counts: [AtomicU64; Reason::ALL.len()],
    /// When a refusal was last logged, and how many were not since.
    log: Mutex<(Option<Instant>, u64)>,
}

impl Refusals {
    /// Counts a refused handshake on `listener` (as the config names it) from `peer`,
    /// and logs it unless another was logged within the last second (the line then
    /// says how many went unlogged); a client that just closed is logged at debug.
    pub fn refused(&self, listener: &str, peer: SocketAddr, reason: Reason, detail: &str) {
        self.counts[reason as usize].fetch_add(1, Ordering::Relaxed);
        if reason == Reason::Closed {
            tracing::debug!(listener, %peer, detail, "tls: the client closed mid-handshake");
            return;
        }
        let now = Instant::now();
        let unlogged = {
            let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            if log.0.is_some_and(|at| now.duration_since(at) < LOG_EVERY) {
                log.1 += 1;
                return;
            }
            std::mem::replace(&mut *log, (Some(now), 0)).1
        };
        tracing::warn!(
            listener,
            %peer,
            reason = reason.label(),
            detail,
            unlogged,
            "tls: handshake refused (at most one line a second per listener; every one is \
             counted in tollgate_tls_handshake_failures_total)"
        );
    }

    /// The refusals so far, by reason label.
    pub fn counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        (Reason::ALL.iter().zip(&self.counts)).map(|(r, n)| (r.label(), n.load(Ordering::Relaxed)))
    }
}

/// `{prefix}_tls_handshake_failures_total{listener,reason}` for some listeners, read
/// at each scrape (every reason from 0, so that `increase()` sees the first).
#[derive(Debug)]
pub struct RefusalMetrics {
    name: String,
    listeners: Vec<(&'static str, Arc<Refusals>)>,
}

impl RefusalMetrics {
    /// The family `{prefix}_tls_handshake_failures` of `listeners` (name, refusals).
    pub fn new(prefix: &str, listeners: Vec<(&'static str, Arc<Refusals>)>) -> Self {
        RefusalMetrics {
            name: format!("{prefix}_tls_handshake_failures"),
            listeners,
        }
    }
}

impl prometheus_client::collector::Collector for RefusalMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::NoLabelSet;
        use prometheus_client::metrics::MetricType;
        if self.listeners.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            &self.name,
            "TLS handshakes each listener refused, by reason: timeout, not_tls, \
             no_client_certificate, client_certificate_unknown_ca, \
             client_certificate_invalid, refused_by_client (it does not trust the \
             listener's certificate or its name), incompatible, closed, other",
            None,
            MetricType::Counter,
        )?;
        for (listener, refusals) in &self.listeners {
            for (reason, n) in refusals.counts() {
                let labels = [("listener", *listener), ("reason", reason)];
                (family.encode_family(&labels)?).encode_counter::<NoLabelSet, _, u64>(&n, None)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_told_apart() {
        let io = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let cases = [
            (
                io(rustls::Error::NoCertificatesPresented),
                "no_client_certificate",
            ),
            (
                io(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )),
                "client_certificate_unknown_ca",
            ),
            (
                io(rustls::Error::InvalidCertificate(CertificateError::Expired)),
                "client_certificate_invalid",
            ),
            (
                io(rustls::Error::AlertReceived(AlertDescription::UnknownCA)),
                "refused_by_client",
            ),
            (
                io(rustls::Error::AlertReceived(
                    AlertDescription::ProtocolVersion,
                )),
                "incompatible",
            ),
            (
                std::io::Error::from(std::io::ErrorKind::ConnectionReset),
                "closed",
            ),
        ];
        for (e, label) in cases {
            assert_eq!(Reason::of(&e).label(), label, "{e}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_refusal_counts_and_one_a_second_is_logged() {
        let r = Refusals::default();
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        for _ in 0..5 {
            r.refused("listen.http_tls", peer, Reason::NotTls, "x");
        }
        assert_eq!(r.log.lock().unwrap().1, 4);
        tokio::time::advance(LOG_EVERY).await;
        r.refused("listen.http_tls", peer, Reason::Timeout, "x");
        assert_eq!(r.log.lock().unwrap().1, 0);
        let counts: Vec<_> = r.counts().filter(|(_, n)| *n > 0).collect();
        assert_eq!(counts, [("timeout", 1), ("not_tls", 5)]);
    }
}
