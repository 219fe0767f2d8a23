//! What every executor keeps between requests: the configuration `initialize` accepted and
//! the sessions it started, each behind a lock that a panicking request cannot poison.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ExecutorError;
use crate::error::ErrorKind;

/// Locks a mutex, taking the data even if a panicking thread poisoned it: a request that
/// panicked must not take every later request down with it.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// A value `initialize` sets once and every later request reads: the configuration, or what
/// is made from it (a cluster client).
#[derive(Debug)]
pub struct Initialized<T> {
    value: Mutex<Option<Arc<T>>>,
}

impl<T> Default for Initialized<T> {
    fn default() -> Self {
        Initialized { value: Mutex::new(None) }
    }
}

impl<T> Initialized<T> {
    /// Sets it (again, if `initialize` came twice); returns it.
    pub fn set(&self, value: T) -> Arc<T> {
        let value = Arc::new(value);
        *lock(&self.value) = Some(Arc::clone(&value));
        value
    }

    /// The value, or the protocol's `NOT_INITIALIZED` error before `initialize`.
    pub fn get(&self) -> Result<Arc<T>, ExecutorError> {
        lock(&self.value).clone().ok_or_else(|| ExecutorError::new(ErrorKind::NotInitialized, "initialize first"))
    }
}

/// The sessions an executor started and has not stopped, by id.
#[derive(Debug)]
pub struct Sessions<S> {
    by_id: Mutex<HashMap<String, Arc<S>>>,
}

impl<S> Default for Sessions<S> {
    fn default() -> Self {
        Sessions { by_id: Mutex::new(HashMap::new()) }
    }
}

impl<S> Sessions<S> {
    /// A session, or the protocol's `UNKNOWN_SESSION` error.
    pub fn get(&self, id: &str) -> Result<Arc<S>, ExecutorError> {
        self.lock().get(id).cloned().ok_or_else(|| ExecutorError::unknown_session(id))
    }

    /// The map itself, locked: to add, remove, list or sweep sessions. Hold the guard across
    /// no `.await`.
    pub fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<S>>> {
        lock(&self.by_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::code;

    #[test]
    fn before_initialize_a_value_is_not_initialized_and_after_it_is_shared() {
        let cell: Initialized<String> = Initialized::default();
        assert_eq!(cell.get().expect_err("not yet").kind, ErrorKind::NotInitialized);
        let set = cell.set("config".to_string());
        assert!(Arc::ptr_eq(&set, &cell.get().expect("set")));
    }

    #[test]
    fn an_unknown_session_is_the_protocols_error_and_a_poisoned_map_still_answers() {
        let sessions: Arc<Sessions<u32>> = Arc::default();
        sessions.lock().insert("a".into(), Arc::new(1));
        assert_eq!(*sessions.get("a").expect("a"), 1);
        assert_eq!(sessions.get("b").expect_err("unknown").kind.code(), code::UNKNOWN_SESSION);
        let poisoner = Arc::clone(&sessions);
        let _ = std::thread::spawn(move || {
            let _guard = poisoner.lock();
            panic!("a request panics holding the lock");
        })
        .join();
        assert_eq!(*sessions.get("a").expect("still answers"), 1);
    }
}
