//! Tests of the two cache commands against a loopback object store: an archive made by
//! `cache-archiver` and uploaded (presigned PUT, or an Azure block blob addressed like an
//! emulator) comes back through `cache-extractor` in another project; and the failure
//! modes the generated script relies on (a missing cache fails so the next key is tried; a
//! refused upload is fatal and not retried; a server error is retried).

use std::fs;

use crate::cache_extractor::{flags, run};
use crate::ctx::{Ctx, Exit};
use crate::testkit::{Reply, Server, args, object_store, project};

fn archive(ctx: &mut Ctx, list: &[&str]) -> Result<(), Exit> {
    let parsed =
        crate::flags::parse(&crate::cache_archiver::flags(), &args(list), &ctx.env).expect("flags");
    crate::cache_archiver::run(ctx, &parsed)
}

fn extract(ctx: &mut Ctx, list: &[&str]) -> Result<(), Exit> {
    let parsed = crate::flags::parse(&flags(), &args(list), &ctx.env).expect("flags");
    run(ctx, &parsed)
}

fn vendor(ctx: &Ctx) {
    fs::create_dir_all(ctx.wd.join("vendor/sub")).expect("dirs");
    fs::write(ctx.wd.join("vendor/a.txt"), "a").expect("file");
    fs::write(ctx.wd.join("vendor/sub/b.txt"), "b").expect("file");
}

const FILE: &str = "../cache/key/cache.zip";

#[test]
fn a_cache_archived_to_a_presigned_url_extracts_in_another_project() {
    let store = object_store();
    let url = format!("{}/bucket/project/1/key?X-Amz-Signature=secret", store.base);
    let (_a, mut first, log) = project(&[]);
    vendor(&first);
    let upload = [
        "--file",
        FILE,
        "--path",
        "vendor",
        "--url",
        &url,
        "--header",
        "x-amz-meta-cachekey: key",
        "--timeout",
        "1",
    ];
    archive(&mut first, &upload).expect("archived");
    let put = store.requests().into_iter().next().expect("a PUT");
    assert_eq!(
        (put.method.as_str(), put.target.as_str()),
        ("PUT", "/bucket/project/1/key?X-Amz-Signature=secret")
    );
    assert_eq!(put.header("Content-Type"), Some("application/octet-stream"));
    assert!(
        put.header("Last-Modified")
            .is_some_and(|d| d.ends_with(" GMT"))
    );
    assert_eq!(put.header("x-amz-meta-cachekey"), Some("key"));
    assert!(put.body.starts_with(b"PK\x03\x04"));
    let text = log.text();
    assert!(
        text.contains(&format!(
            "Uploading cache.zip to {}/bucket/project/1/key",
            store.base
        )),
        "{text}"
    );
    assert!(!text.contains("secret"), "{text}");

    let (_b, mut second, log) = project(&[]);
    extract(
        &mut second,
        &["--file", FILE, "--url", &url, "--timeout", "1"],
    )
    .expect("extracted");
    assert_eq!(
        fs::read_to_string(second.wd.join("vendor/sub/b.txt")).expect("restored"),
        "b"
    );
    let metadata =
        fs::read_to_string(second.wd.join("../cache/key/metadata.json")).expect("metadata");
    assert_eq!(metadata, "{\"cachekey\":\"key\"}");
    let text = log.text();
    assert!(
        text.contains(&format!(
            "Downloading cache from {}/bucket/project/1/key",
            store.base
        )),
        "{text}"
    );
    assert!(text.contains("etag=\"etag-1\""), "{text}");
}

#[test]
fn a_missing_remote_cache_fails_so_the_script_tries_the_next_key() {
    let store = object_store();
    let (_dir, mut ctx, log) = project(&[]);
    let url = format!("{}/bucket/none", store.base);
    assert_eq!(
        extract(&mut ctx, &["--file", FILE, "--url", &url]),
        Err(Exit::FAILURE)
    );
    assert!(
        log.text().contains("WARNING: file does not exist"),
        "{}",
        log.text()
    );
}

#[test]
fn without_a_url_a_missing_local_cache_fails() {
    let (_dir, mut ctx, log) = project(&[]);
    assert_eq!(extract(&mut ctx, &["--file", FILE]), Err(Exit::FAILURE));
    let text = log.text();
    assert!(
        text.contains("No URL provided, cache will not be downloaded from shared cache server."),
        "{text}"
    );
    assert!(
        text.contains("WARNING: Cache file does not exist"),
        "{text}"
    );
}

#[test]
fn a_refused_upload_is_fatal_with_the_storage_error_and_not_retried() {
    let body = "<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>";
    let server = Server::start(move |_| {
        Reply::new(403)
            .header("Content-Type", "application/xml")
            .body(body)
    });
    let (_dir, mut ctx, log) = project(&[]);
    vendor(&ctx);
    let url = format!("{}/bucket/key", server.base);
    assert_eq!(
        archive(
            &mut ctx,
            &["--file", FILE, "--path", "vendor", "--url", &url]
        ),
        Err(Exit::FAILURE)
    );
    assert_eq!(server.requests().len(), 1);
    let text = log.text();
    assert!(
        text.contains("FATAL: received: 403 Forbidden. Request failed with code: AccessDenied, message: Request has expired"),
        "{text}"
    );
    assert!(ctx.wd.join(FILE).exists(), "the local archive is kept");
}

#[test]
fn a_server_error_is_retried_twice() {
    let server = Server::start(|_| Reply::new(503));
    let (_dir, mut ctx, log) = project(&[]);
    vendor(&ctx);
    let url = format!("{}/bucket/key", server.base);
    let list = [
        "--file",
        FILE,
        "--path",
        "vendor",
        "--url",
        &url,
        "--retry-time",
        "1ms",
    ];
    assert_eq!(archive(&mut ctx, &list), Err(Exit::FAILURE));
    assert_eq!(server.requests().len(), 3);
    assert!(log.text().contains("WARNING: Retrying..."));
}

#[test]
fn an_unchanged_cache_is_not_rebuilt() {
    let (_dir, mut ctx, log) = project(&[]);
    vendor(&ctx);
    let list = ["--file", FILE, "--alternate-file", FILE, "--path", "vendor"];
    archive(&mut ctx, &list).expect("first");
    assert!(
        log.text()
            .contains("No URL provided, cache will not be uploaded to shared cache server.")
    );
    archive(&mut ctx, &list).expect("second");
    assert!(log.text().contains("Archive is up to date!"));
}

#[test]
fn an_azure_blob_round_trip_goes_through_an_emulator_addressed_service_url() {
    let store = object_store();
    let host = store.base.trim_start_matches("http://").to_string();
    let (_a, mut first, log) = project(&[("AZURE_STORAGE_PROTOCOL", "http")]);
    vendor(&first);
    let env_file = first.wd.join("../cache_env");
    let sas = "sv=2021-08-06&sp=w&sig=c2VjcmV0";
    fs::write(&env_file, format!("AZURE_STORAGE_ACCOUNT=\"devstoreaccount1\"\nAZURE_STORAGE_DOMAIN=\"{host}\"\nAZURE_STORAGE_SAS_TOKEN=\"{sas}\"\n"))
        .expect("env file");
    let gocloud = "azblob://cache/runner/x/project/1/key";
    let list = [
        "--file",
        FILE,
        "--path",
        "vendor",
        "--gocloud-url",
        gocloud,
        "--env-file",
        "../cache_env",
        "--metadata",
        "{\"cachekey\":\"key\"}",
    ];
    archive(&mut first, &list).expect("archived");
    let put = store.requests().into_iter().next().expect("a PUT");
    assert_eq!(
        put.target,
        format!("/devstoreaccount1/cache/runner/x/project/1/key?{sas}")
    );
    assert_eq!(put.header("x-ms-blob-type"), Some("BlockBlob"));
    assert_eq!(put.header("x-ms-meta-cachekey"), Some("key"));
    assert!(
        log.text()
            .contains("Uploading cache.zip to azblob://cache/runner/x/project/1/key"),
        "{}",
        log.text()
    );

    let (_b, mut second, log) = project(&[("AZURE_STORAGE_PROTOCOL", "http")]);
    fs::copy(&env_file, second.wd.join("../cache_env")).expect("env file");
    extract(
        &mut second,
        &[
            "--file",
            FILE,
            "--gocloud-url",
            gocloud,
            "--env-file",
            "../cache_env",
        ],
    )
    .expect("extracted");
    assert_eq!(
        fs::read_to_string(second.wd.join("vendor/a.txt")).expect("restored"),
        "a"
    );
    assert!(
        log.text()
            .contains("Downloading cache from azblob://cache/runner/x/project/1/key"),
        "{}",
        log.text()
    );
    assert!(!log.text().contains("c2VjcmV0"));
}
