//! Who may read the status page. On a loopback address, anyone who can connect (the host's
//! users). With `--http-public`, only a request bearing the token of the env file
//! (`Authorization: Bearer TOKEN`), or the cookie of a session that a one-time link opened: a
//! token holder asks for a link (`POST /login-link`), a browser opens it once, and gets the
//! cookie. The token itself never travels in a URL.

use std::collections::HashMap;
use std::io::Read as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};

/// The session cookie's name.
pub const COOKIE: &str = "knotless_session";
/// How long a one-time link may wait before it is opened.
pub const LINK_LIFETIME: Duration = Duration::from_secs(600);
/// How long a session lasts.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
/// The fewest characters a token may have.
pub const TOKEN_MIN: usize = 32;
/// The most links or sessions kept at once: the oldest go first.
const KEPT: usize = 1000;

/// The page's credentials: the token (when the page is public), the open links and sessions.
pub struct Auth {
    token: Option<String>,
    links: Mutex<HashMap<String, Instant>>,
    sessions: Mutex<HashMap<String, Instant>>,
}

/// Compares without stopping at the first difference, so timing does not tell the token.
fn same(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// 32 random bytes from the kernel, as hex.
fn random_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Keeps a new id, dropping expired ones and, past [`KEPT`], the oldest.
fn keep(map: &Mutex<HashMap<String, Instant>>, id: String, lifetime: Duration) {
    let mut map = map.lock().unwrap_or_else(|poison| poison.into_inner());
    map.retain(|_, made| made.elapsed() < lifetime);
    if map.len() >= KEPT
        && let Some(oldest) = map.iter().min_by_key(|(_, made)| **made).map(|(id, _)| id.clone())
    {
        map.remove(&oldest);
    }
    map.insert(id, Instant::now());
}

/// The credentials of an `Authorization` value of the `Bearer` scheme, whose name is
/// case-insensitive (RFC 9110, section 11.1): `Bearer TOKEN`, `bearer TOKEN`, `BEARER  TOKEN`.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.trim().split_once([' ', '\t'])?;
    scheme.eq_ignore_ascii_case("bearer").then(|| credentials.trim())
}

impl Auth {
    /// Credentials for a page that asks for `token` (`None`: a loopback page that asks none).
    pub fn new(token: Option<String>) -> Auth {
        Auth { token, links: Mutex::default(), sessions: Mutex::default() }
    }

    /// Whether the request bears the token.
    pub fn has_token(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else { return false };
        headers
            .get_all(header::AUTHORIZATION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .filter_map(bearer)
            .any(|given| same(given.as_bytes(), token.as_bytes()))
    }

    /// Whether the request may read the page.
    pub fn allows(&self, headers: &HeaderMap) -> bool {
        if self.token.is_none() || self.has_token(headers) {
            return true;
        }
        let sessions = self.sessions.lock().unwrap_or_else(|poison| poison.into_inner());
        cookies(headers).any(|(name, value)| {
            name == COOKIE
                && sessions
                    .iter()
                    .any(|(id, made)| same(value.as_bytes(), id.as_bytes()) && made.elapsed() < SESSION_LIFETIME)
        })
    }

    /// A new one-time link's secret part.
    pub fn new_link(&self) -> std::io::Result<String> {
        let id = random_id()?;
        keep(&self.links, id.clone(), LINK_LIFETIME);
        Ok(id)
    }

    /// Uses a one-time link up: a new session's id when the link was open and fresh.
    pub fn redeem(&self, link: &str) -> Option<String> {
        let made = self.links.lock().unwrap_or_else(|poison| poison.into_inner()).remove(link)?;
        if made.elapsed() >= LINK_LIFETIME {
            return None;
        }
        let session = random_id().ok()?;
        keep(&self.sessions, session.clone(), SESSION_LIFETIME);
        Some(session)
    }
}

/// The `name=value` pairs of the request's cookies.
fn cookies(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_str(value).expect("a header value"));
        headers
    }

    #[test]
    fn a_public_page_takes_the_token_or_a_session_a_link_opened_once() {
        let token = "t".repeat(TOKEN_MIN);
        let auth = Auth::new(Some(token.clone()));
        assert!(!auth.allows(&HeaderMap::new()));
        assert!(!auth.allows(&headers(header::AUTHORIZATION, "Bearer wrong")));
        assert!(auth.allows(&headers(header::AUTHORIZATION, &format!("Bearer {token}"))));
        for spelling in [format!("bearer {token}"), format!("BEARER  {token}"), format!("BeArEr\t{token} ")] {
            assert!(auth.allows(&headers(header::AUTHORIZATION, &spelling)), "{spelling:?}");
        }
        for wrong in [format!("Basic {token}"), format!("Bearer{token}"), token.clone(), format!("Bearer x{token}")] {
            assert!(!auth.allows(&headers(header::AUTHORIZATION, &wrong)), "{wrong:?}");
        }
        let link = auth.new_link().expect("a link");
        let session = auth.redeem(&link).expect("the link opens once");
        assert!(auth.redeem(&link).is_none(), "a link opens only once");
        assert!(auth.allows(&headers(header::COOKIE, &format!("a=b; {COOKIE}={session}"))));
        assert!(!auth.allows(&headers(header::COOKIE, &format!("{COOKIE}={link}"))));
        assert!(Auth::new(None).allows(&HeaderMap::new()), "a loopback page asks nothing");
    }
}
