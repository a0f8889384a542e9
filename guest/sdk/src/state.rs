//! The cell a plugin keeps its state in between calls: empty until `init` fills it, replaced by
//! a second `init`, and read by every other export. A component instance runs one call at a
//! time on one thread, so a `thread_local!` of this cell is the plugin's whole memory:
//!
//! ```text
//! thread_local! {
//!     static STATE: flotilla_guest::State<Plugin> = const { flotilla_guest::State::new() };
//! }
//! ```

use std::cell::RefCell;

/// What a plugin holds between calls, `None` until `init`.
#[derive(Debug, Default)]
pub struct State<T> {
    cell: RefCell<Option<T>>,
}

/// A call other than `init` came first: the plugin turns it into its contract error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotInitialized;

impl std::fmt::Display for NotInitialized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("init has not been called")
    }
}

impl std::error::Error for NotInitialized {}

impl<T> State<T> {
    /// An empty cell, for a `thread_local!` const initializer.
    pub const fn new() -> Self {
        State {
            cell: RefCell::new(None),
        }
    }

    /// Fills the cell (`init`), replacing what an earlier `init` left.
    pub fn set(&self, value: T) {
        *self.cell.borrow_mut() = Some(value);
    }

    /// Runs `f` on the state, or answers [`NotInitialized`] before `init`. `f` may read the
    /// state again, but not change it.
    pub fn read<R, E: From<NotInitialized>>(
        &self,
        f: impl FnOnce(&T) -> Result<R, E>,
    ) -> Result<R, E> {
        match self.cell.borrow().as_ref() {
            Some(state) => f(state),
            None => Err(NotInitialized.into()),
        }
    }

    /// Runs `f` on the state to change it, or answers [`NotInitialized`] before `init`.
    pub fn change<R, E: From<NotInitialized>>(
        &self,
        f: impl FnOnce(&mut T) -> Result<R, E>,
    ) -> Result<R, E> {
        match self.cell.borrow_mut().as_mut() {
            Some(state) => f(state),
            None => Err(NotInitialized.into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)] // test code
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    enum Error {
        Other(String),
    }

    impl From<NotInitialized> for Error {
        fn from(e: NotInitialized) -> Self {
            Error::Other(e.to_string())
        }
    }

    thread_local! {
        static CELL: State<Vec<u32>> = const { State::new() };
    }

    #[test]
    fn a_call_before_init_is_refused_and_init_replaces() {
        let len = |s: &State<Vec<u32>>| s.read(|v| Ok::<_, Error>(v.len()));
        CELL.with(|s| {
            assert_eq!(len(s), Err(Error::Other("init has not been called".into())));
            assert_eq!(
                s.change(|v| Ok::<_, Error>(v.len())),
                Err(Error::Other("init has not been called".into()))
            );
            s.set(vec![1, 2]);
            assert_eq!(len(s), Ok(2));
            s.change(|v| {
                v.push(3);
                Ok::<_, Error>(())
            })
            .unwrap();
            assert_eq!(len(s), Ok(3));
            s.set(Vec::new());
            assert_eq!(len(s), Ok(0));
        });
    }
}
