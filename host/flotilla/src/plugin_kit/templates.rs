//! The Python and JavaScript templates embedded for `flotilla plugin new` (the Rust one is in
//! `new.rs`). Each list is every file of the template but its `wit/` link, which
//! `plugin new` writes from the WIT package itself.

/// plugin-template/python, as `(path, text)`.
pub const PYTHON: [(&str, &str); 6] = [
    (
        ".gitignore",
        include_str!("../../../../plugin-template/python/.gitignore"),
    ),
    (
        "README.md",
        include_str!("../../../../plugin-template/python/README.md"),
    ),
    (
        "build.sh",
        include_str!("../../../../plugin-template/python/build.sh"),
    ),
    (
        "requirements.txt",
        include_str!("../../../../plugin-template/python/requirements.txt"),
    ),
    (
        "src/app.py",
        include_str!("../../../../plugin-template/python/src/app.py"),
    ),
    (
        "src/flotilla_http.py",
        include_str!("../../../../plugin-template/python/src/flotilla_http.py"),
    ),
];
/// Its own name in its files.
pub const PYTHON_NAME: &str = "flotilla-plugin-template-python";
/// plugin-template/js, as `(path, text)`.
pub const JS: [(&str, &str); 8] = [
    (
        ".gitignore",
        include_str!("../../../../plugin-template/js/.gitignore"),
    ),
    (
        "README.md",
        include_str!("../../../../plugin-template/js/README.md"),
    ),
    (
        "build.mjs",
        include_str!("../../../../plugin-template/js/build.mjs"),
    ),
    (
        "flotilla-contract.js",
        include_str!("../../../../plugin-template/js/flotilla-contract.js"),
    ),
    (
        "flotilla-http.js",
        include_str!("../../../../plugin-template/js/flotilla-http.js"),
    ),
    (
        "package.json",
        include_str!("../../../../plugin-template/js/package.json"),
    ),
    (
        "package-lock.json",
        include_str!("../../../../plugin-template/js/package-lock.json"),
    ),
    (
        "plugin.js",
        include_str!("../../../../plugin-template/js/plugin.js"),
    ),
];
/// Its own name in its files.
pub const JS_NAME: &str = "flotilla-plugin-template-js";
