//! The real services tests talk to: PostgreSQL and Redis servers of Debian's packages, each
//! started on loopback for one test in its own directory and stopped when dropped.

use super::*;
use std::path::{Path, PathBuf};

/// A PostgreSQL server of Debian's packages, started on loopback for a test in its own data
/// directory (trust authentication, user `cachet`), stopped when dropped.
pub struct PgServer {
    /// `postgres://cachet@127.0.0.1:PORT/postgres`
    pub url: String,
    bin: PathBuf,
    dir: PathBuf,
    root: bool,
}

impl PgServer {
    /// Starts one, or says why not: `None` where the machine has no PostgreSQL server binaries
    /// (`apt install postgresql`; CI installs them).
    pub fn start() -> Option<PgServer> {
        Self::start_with(None)
    }

    /// As [`PgServer::start`], serving TLS with `tls`'s certificate and refusing connections
    /// without it (`hostnossl … reject`); a client certificate signed by its `client_ca` logs in
    /// as the user of its common name where `cert_user` is that user (`hostssl … cert`).
    pub fn start_tls(tls: &PgTls) -> Option<PgServer> {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<&PgTls>) -> Option<PgServer> {
        let bin = pg_bindir()?;
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("cachet-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pg = PgServer {
            url: format!("postgres://cachet@127.0.0.1:{port}/postgres"),
            bin,
            dir,
            root,
        };
        if root {
            // The server refuses to run as root: Debian's package made a `postgres` user.
            assert!(std::process::Command::new("chown")
                .args(["postgres:postgres", pg.dir.to_str().unwrap()])
                .status()
                .unwrap()
                .success());
        }
        let data = pg.dir.join("data");
        let ok = pg.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "cachet",
                "--no-sync",
            ],
        );
        assert!(ok, "initdb failed");
        let mut opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -F",
            pg.dir.display()
        );
        if let Some(tls) = tls {
            pg.write_tls(&data, tls);
            opts.push_str(" -c ssl=on -c ssl_ca_file=client-ca.pem");
        }
        let log = pg.dir.join("log");
        let ok = pg.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
        assert!(
            ok,
            "pg_ctl start failed: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Some(pg)
    }

    /// The server's certificate, its key and the client CA in `data`; `pg_hba.conf` that takes
    /// TLS connections only.
    fn write_tls(&self, data: &Path, tls: &PgTls) {
        let files = [
            ("server.crt", tls.cert_pem.as_str()),
            ("server.key", tls.key_pem.as_str()),
            ("client-ca.pem", tls.client_ca_pem.as_str()),
            (
                "pg_hba.conf",
                &format!(
                    "local all all trust\n\
                     hostssl all {} 127.0.0.1/32 cert\n\
                     hostssl all all 127.0.0.1/32 trust\n\
                     hostnossl all all 127.0.0.1/32 reject\n",
                    tls.cert_user
                ),
            ),
        ];
        for (name, text) in files {
            let path = data.join(name);
            std::fs::write(&path, text).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            if self.root {
                assert!(std::process::Command::new("chown")
                    .args(["postgres:postgres", path.to_str().unwrap()])
                    .status()
                    .unwrap()
                    .success());
            }
        }
    }

    fn run(&self, tool: &str, args: &[&str]) -> bool {
        let exe = self.bin.join(tool);
        let mut c = if self.root {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            std::process::Command::new(&exe)
        };
        c.args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        self.run(
            "pg_ctl",
            &["-D", data.to_str().unwrap(), "-m", "immediate", "stop"],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a [`PgServer::start_tls`] serves: its certificate and key (PEM), the CA its clients'
/// certificates are checked against, and the user that logs in by certificate.
pub struct PgTls {
    pub cert_pem: String,
    pub key_pem: String,
    pub client_ca_pem: String,
    pub cert_user: String,
}

/// Where the PostgreSQL server binaries are (Debian: /usr/lib/postgresql/<version>/bin).
fn pg_bindir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

/// A Redis server of Debian's package (`redis-server`), started on a free loopback port for a
/// test (no persistence), killed when dropped.
pub struct RedisServer {
    /// `redis://127.0.0.1:PORT/0`
    pub url: String,
    pub port: u16,
    proc: Proc,
}

impl RedisServer {
    /// Starts one and waits until it answers, or `None` where the machine has no `redis-server`
    /// (`apt install redis-server`; CI installs it).
    pub fn start() -> Option<RedisServer> {
        let exe = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())?;
        let port = free_port();
        let proc = Proc(
            std::process::Command::new(exe)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("starting redis-server"),
        );
        let server = RedisServer {
            url: format!("redis://127.0.0.1:{port}/0"),
            port,
            proc,
        };
        let t0 = std::time::Instant::now();
        while !server.answers() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(20),
                "redis-server did not start on port {port}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Some(server)
    }

    /// Whether a PING gets its PONG (the protocol's inline form, over a plain socket).
    pub fn answers(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        let mut buf = [0u8; 16];
        s.write_all(b"PING\r\n").is_ok()
            && s.read(&mut buf)
                .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
    }

    /// Stops the server (a Redis outage) now.
    pub fn kill(&mut self) {
        let _ = self.proc.0.kill();
        let _ = self.proc.0.wait();
    }
}
