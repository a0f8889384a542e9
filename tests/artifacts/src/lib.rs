//! Paths of the guest components built by this crate's build script.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// Fails to compile unless the calling module has an item named after every test guest
/// (by convention a `mod` holding that guest's tests).
#[macro_export]
macro_rules! assert_test_guests_covered {
    () => {
        macro_rules! __flotilla_assert_guest_tested {
            ($name:ident) => {
                #[allow(unused_imports)]
                use self::$name as _;
            };
        }
        $crate::foreach_test_guest!(__flotilla_assert_guest_tested);
    };
}
