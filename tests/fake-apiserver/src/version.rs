//! The Kubernetes version the server reports and models (`--kubernetes-version`): `GET
//! /version` (staging/src/k8s.io/apimachinery/pkg/version/types.go `Info`), and the exec
//! subprotocols its websocket negotiates.
//!
//! From 1.30 the API server answers an exec's websocket itself and speaks
//! `v5.channel.k8s.io`, whose CLOSE signal (channel 255) ends the command's stdin (the
//! `TranslateStreamCloseWebsocketRequests` gate, alpha and off in 1.29, beta and on from 1.30:
//! pkg/features/kube_features.go; staging/src/k8s.io/apiserver/pkg/util/proxy/streamtranslator.go).
//! Before, it hands the upgrade to the kubelet, whose websocket speaks `v4.channel.k8s.io` and
//! older, with no CLOSE signal: a frame on channel 255 is a frame for no channel, ignored, and
//! the only end of stdin is the end of the connection, which ends the exec's streams and its
//! Status with it (staging/src/k8s.io/kubelet/pkg/cri/streaming/remotecommand/websocket.go
//! `createWebSocketStreams`; staging/src/k8s.io/apimachinery/pkg/util/httpstream/wsstream/conn.go
//! `handle`). The unversioned `channel.k8s.io` and the base64 protocols are not modelled.
//!
//! Both pick the first protocol of the client's list that they speak (conn.go `handshake`),
//! in the client's order, not the server's.

use serde_json::{Value, json};

/// The version of the modelled cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

/// The version a fake cluster is unless told otherwise.
pub const DEFAULT: &str = "1.35.0";

/// The exec subprotocol with the CLOSE signal.
pub const V5: &str = "v5.channel.k8s.io";

/// The exec subprotocol with the exit code in a Status, and no CLOSE signal.
pub const V4: &str = "v4.channel.k8s.io";

impl KubeVersion {
    /// `1.29`, `1.29.4` or `v1.29.4`.
    pub fn parse(text: &str) -> Result<KubeVersion, String> {
        let trimmed = text.trim().trim_start_matches('v');
        let mut parts = trimmed.split('.').map(str::parse::<u32>);
        let wrong = || format!("{text}: not a Kubernetes version (MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. 1.29.4)");
        let major = parts.next().and_then(Result::ok).ok_or_else(wrong)?;
        let minor = parts.next().and_then(Result::ok).ok_or_else(wrong)?;
        let patch = match parts.next() {
            None => 0,
            Some(patch) => patch.map_err(|_| wrong())?,
        };
        if parts.next().is_some() || major != 1 {
            return Err(wrong());
        }
        Ok(KubeVersion { major, minor, patch })
    }

    /// The exec subprotocols the server speaks.
    pub fn exec_protocols(&self) -> &'static [&'static str] {
        if self.minor >= 30 { &[V5, V4] } else { &[V4] }
    }

    /// The protocol an exec's upgrade gets: the first of the client's that the server speaks.
    pub fn negotiate<'a>(&self, requested: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
        requested.into_iter().find_map(|asked| self.exec_protocols().iter().copied().find(|ours| *ours == asked.trim()))
    }

    /// `GET /version`. The emulation and compatibility versions are there from 1.33 (their
    /// fields are `omitempty` before).
    pub fn info(&self) -> Value {
        let KubeVersion { major, minor, patch } = *self;
        let mut info = json!({"major": major.to_string(), "minor": minor.to_string(),
            "gitVersion": format!("v{major}.{minor}.{patch}"), "gitCommit": "fake", "gitTreeState": "clean",
            "buildDate": "2025-12-17T00:00:00Z", "goVersion": "go1.25.5", "compiler": "gc", "platform": "linux/amd64"});
        if minor >= 33 {
            info["emulationMajor"] = json!(major.to_string());
            info["emulationMinor"] = json!(minor.to_string());
            info["minCompatibilityMajor"] = json!(major.to_string());
            info["minCompatibilityMinor"] = json!((minor - 1).to_string());
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_refuse_what_is_no_version() {
        assert_eq!(KubeVersion::parse("1.29.4"), Ok(KubeVersion { major: 1, minor: 29, patch: 4 }));
        assert_eq!(KubeVersion::parse("v1.30"), Ok(KubeVersion { major: 1, minor: 30, patch: 0 }));
        for wrong in ["", "1", "2.0", "1.x", "1.29.4.1", "1.29."] {
            assert!(KubeVersion::parse(wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn exec_speaks_v5_from_1_30_and_only_v4_before_in_the_clients_order() {
        let old = KubeVersion::parse("1.29.9").expect("version");
        let new = KubeVersion::parse("1.30.0").expect("version");
        assert_eq!(old.negotiate([V5, V4]), Some(V4));
        assert_eq!(old.negotiate([V5]), None);
        assert_eq!(new.negotiate([V5, V4]), Some(V5));
        assert_eq!(new.negotiate([V4, V5]), Some(V4), "the client's preference, not the server's");
        assert_eq!(new.negotiate(["channel.k8s.io"]), None);
    }

    #[test]
    fn the_version_info_has_emulation_fields_from_1_33() {
        let info = KubeVersion::parse("1.29.4").expect("version").info();
        assert_eq!((info["minor"].as_str(), info["gitVersion"].as_str()), (Some("29"), Some("v1.29.4")));
        assert!(info.get("emulationMinor").is_none());
        let info = KubeVersion::parse(DEFAULT).expect("version").info();
        assert_eq!((info["emulationMinor"].as_str(), info["minCompatibilityMinor"].as_str()), (Some("35"), Some("34")));
    }
}
