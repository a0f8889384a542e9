//! The peers' own tests, one binary: the loopback machine (`sshd`), the stand-in GitLab
//! (`gitlab`), the runner's stage scripts (`runner_scripts`) and the distributed-cache stores
//! (`cache_stores`).

mod cache_stores;
mod gitlab;
mod runner_scripts;
mod sshd;
