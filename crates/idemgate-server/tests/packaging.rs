//! What ships around the binary, held to the binary and the docs: `idemgate
//! --version`; the `Dockerfile`, `compose.yaml` and `deploy/kubernetes/`
//! validated by maintained validators (installed by `scripts/services.sh
//! deploy-tools` from the lock `deploy/tools/requirements.txt`); and their
//! environment variables, ports, paths and commands compared with what
//! `idemgate proxy --help` / `idemgate serve --help` and `docs/deploy.md` name.
//! No container runs here, so the image's runtime settings are tried on the real
//! binary instead: started with the image's environment in a stand-in for its
//! working directory, with each shipped route file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use yaml_rust2::{Yaml, YamlLoader};

const BIN: &str = env!("CARGO_BIN_EXE_idemgate");
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The default of `--shutdown-timeout` / IDEMGATE_SHUTDOWN_TIMEOUT_SECONDS: every
/// stop grace period must exceed it.
const SHUTDOWN_TIMEOUT_SECONDS: i64 = 30;

// ---------------------------------------------------------------------------
// --version

#[test]
fn version_names_the_version_and_the_commit() {
    let out = run_ok(Command::new(BIN).arg("--version"));
    let line = stdout(&out);
    let commit = line
        .trim()
        .strip_prefix(&format!("idemgate {VERSION} (commit "))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("`idemgate --version` said {line:?}"));
    // The commit the build saw: the one handed in, else the checkout's HEAD.
    let expected = match option_env!("IDEMGATE_BUILD_COMMIT") {
        Some(commit) => commit.to_owned(),
        None => stdout(&run_ok(
            Command::new("git")
                .args(["rev-parse", "HEAD"])
                .current_dir(workspace()),
        )),
    };
    assert_eq!(commit, &expected.trim()[..12], "{line}");
    // Every subcommand names the same.
    let serve = stdout(&run_ok(Command::new(BIN).args(["serve", "--version"])));
    assert!(
        serve.contains(&format!("{VERSION} (commit {commit})")),
        "{serve}"
    );
}

// ---------------------------------------------------------------------------
// Schemas

#[test]
fn the_deployment_files_pass_their_validators() {
    let root = workspace();
    let compose = [
        "--builtin-schema",
        "vendor.compose-spec",
        root.join("compose.yaml").to_str().unwrap(),
    ]
    .map(str::to_owned);
    run_ok(Command::new(tool("check-jsonschema")).args(&compose));
    let manifests = kubernetes_files();
    run_ok(
        Command::new(tool("kubernetes-validate"))
            .args(["--strict", "--quiet"])
            .args(&manifests),
    );
    run_ok(Command::new(tool("hadolint")).arg(root.join("Dockerfile")));
    run_ok(
        Command::new("promtool")
            .args(["check", "config"])
            .arg(root.join("deploy/prometheus/prometheus.yml")),
    );

    // The validators refuse what they should: an unknown key in either file.
    let dir = TempDir::new("idemgate-packaging-schemas");
    let bad_compose = dir.path().join("compose.yaml");
    let text = std::fs::read_to_string(root.join("compose.yaml")).unwrap();
    std::fs::write(
        &bad_compose,
        text.replacen("stop_grace_period:", "stop_grace:", 1),
    )
    .unwrap();
    let refused = Command::new(tool("check-jsonschema"))
        .args(["--builtin-schema", "vendor.compose-spec"])
        .arg(&bad_compose)
        .output()
        .unwrap();
    assert!(!refused.status.success(), "a misspelt compose key passed");
    let bad_manifest = dir.path().join("shared.yaml");
    let text = std::fs::read_to_string(root.join("deploy/kubernetes/shared.yaml")).unwrap();
    std::fs::write(
        &bad_manifest,
        text.replacen("readinessProbe:", "readinesProbe:", 1),
    )
    .unwrap();
    let refused = Command::new(tool("kubernetes-validate"))
        .args(["--strict", "--quiet"])
        .arg(&bad_manifest)
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "a misspelt manifest field passed"
    );
}

// ---------------------------------------------------------------------------
// The Dockerfile

#[tokio::test]
async fn the_image_is_what_the_help_and_the_docs_describe() {
    let image = Dockerfile::read();
    let proxy = Help::of("proxy");
    let serve = Help::of("serve");
    let deploy_doc = read("docs/deploy.md");

    // Build: both stages on one Debian release (the binary needs its glibc), the
    // official Rust image at least the workspace's rust-version, the one build
    // script, whose binary is the one the runtime stage copies.
    let froms = image.all("FROM");
    assert_eq!(froms.len(), 2, "{froms:?}");
    assert!(
        froms[0].starts_with("rust:") && froms[0].ends_with(" AS build"),
        "{froms:?}"
    );
    assert!(froms[1].starts_with("debian:"), "{froms:?}");
    assert!(
        froms.iter().all(|from| from.contains("${DEBIAN_RELEASE}")),
        "both stages on ${{DEBIAN_RELEASE}}: {froms:?}"
    );
    let rust = froms[0].trim_start_matches("rust:");
    let minor: u32 = rust.split(['.', '-']).nth(1).unwrap().parse().unwrap();
    let msrv = read("Cargo.toml");
    let msrv_minor: u32 = value_of(&msrv, "rust-version")
        .split('.')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        minor >= msrv_minor,
        "rust:{rust} is older than the workspace's rust-version"
    );
    let build = image.all("RUN");
    assert!(
        build
            .iter()
            .any(|run| run.ends_with("scripts/dist.sh /out")),
        "the build stage runs scripts/dist.sh /out: {build:?}"
    );
    let dist = read("scripts/dist.sh");
    assert!(
        dist.contains("cargo build --locked --profile dist -p idemgate-server --bin idemgate"),
        "{dist}"
    );
    assert!(
        dist.contains("\"$1/idemgate\""),
        "dist.sh copies the binary into its argument"
    );
    assert!(
        msrv.contains("[profile.dist]"),
        "Cargo.toml defines the dist profile"
    );
    assert!(
        image
            .all("COPY")
            .contains(&"--from=build /out/idemgate /usr/local/bin/idemgate".to_owned()),
        "{:?}",
        image.all("COPY")
    );
    assert_eq!(image.one("ARG IDEMGATE_BUILD_COMMIT"), "unknown");

    // Runtime: every variable is one `proxy` and `serve` read, the listeners'
    // ports are the exposed ones, the probe asks the admin port for /healthz.
    let env = image.env();
    for name in env.keys() {
        proxy.names_env(name);
        serve.names_env(name);
        assert!(
            deploy_doc.contains(name),
            "docs/deploy.md does not name {name}"
        );
    }
    let listen: SocketAddr = env["IDEMGATE_LISTEN"].parse().unwrap();
    let admin: SocketAddr = env["IDEMGATE_ADMIN_LISTEN"].parse().unwrap();
    assert!(listen.ip().is_unspecified() && admin.ip().is_unspecified());
    let exposed: BTreeSet<u16> = image
        .one("EXPOSE")
        .split_whitespace()
        .map(|port| port.parse().unwrap())
        .collect();
    assert_eq!(exposed, BTreeSet::from([listen.port(), admin.port()]));
    for port in &exposed {
        assert!(
            deploy_doc.contains(&port.to_string()),
            "docs/deploy.md does not name port {port}"
        );
    }
    assert_eq!(proxy.default_of("--admin-listen").port(), admin.port());
    let health = image.one("HEALTHCHECK");
    assert!(
        health.contains("${IDEMGATE_ADMIN_LISTEN##*:}/healthz"),
        "the probe asks the admin port of IDEMGATE_ADMIN_LISTEN for /healthz: {health}"
    );

    // Files: the SQLite defaults are relative, so they land in WORKDIR, which is
    // a declared volume; so is the config directory the deployments mount.
    let workdir = image.one("WORKDIR");
    let volumes: Vec<String> = serde_json::from_str(&image.one("VOLUME")).unwrap();
    assert!(
        volumes.contains(&workdir),
        "WORKDIR {workdir} is not a volume: {volumes:?}"
    );
    assert!(volumes.contains(&CONFIG_DIR.to_owned()), "{volumes:?}");
    assert!(
        proxy
            .default_text("--idempotency-store")
            .starts_with("sqlite://./")
    );
    assert!(serve.default_text("--database").starts_with("sqlite://./"));
    for path in [workdir.as_str(), CONFIG_PATH] {
        assert!(
            deploy_doc.contains(path),
            "docs/deploy.md does not name {path}"
        );
    }
    let user = image.one("USER");
    assert_eq!(user, format!("{UID}:{UID}"));
    assert_eq!(image.one("ENTRYPOINT"), r#"["idemgate"]"#);
    assert_eq!(image.one("CMD"), r#"["proxy"]"#);

    // The image's environment on the real binary, in a stand-in for WORKDIR:
    // both listeners answer, /readyz finds the SQLite store, and its file is
    // where the volume is.
    let data = TempDir::new("idemgate-packaging-workdir");
    let mut vars: BTreeMap<String, String> = env.clone();
    vars.insert("IDEMGATE_LISTEN".into(), "127.0.0.1:0".into());
    vars.insert("IDEMGATE_ADMIN_LISTEN".into(), "127.0.0.1:0".into());
    let proxy = Running::proxy(data.path(), &vars, None);
    proxy.expect(&format!("{}/healthz", proxy.admin), 200).await;
    proxy.expect(&format!("{}/readyz", proxy.admin), 200).await;
    assert!(
        data.path().join("idemgate-proxy.db").exists(),
        "the proxy's default store is not in its working directory"
    );
}

// ---------------------------------------------------------------------------
// compose.yaml

#[tokio::test]
async fn compose_runs_the_image_as_the_help_and_the_docs_describe() {
    let compose = yaml("compose.yaml").remove(0);
    let image = Dockerfile::read();
    let proxy_help = Help::of("proxy");
    let exposed = image.one("EXPOSE");
    let services = compose["services"].as_hash().expect("services");
    let mut proxies = Vec::new();
    for (name, service) in services {
        let name = name.as_str().unwrap();
        if service["image"].as_str() != Some(format!("idemgate:{VERSION}").as_str()) {
            continue;
        }
        proxies.push(name.to_owned());
        assert_eq!(strings(&service["command"]), ["proxy"], "{name}");
        assert_eq!(
            service["build"]["args"]["IDEMGATE_BUILD_COMMIT"].as_str(),
            Some("${IDEMGATE_BUILD_COMMIT:-unknown}"),
            "{name} hands the commit to the build"
        );
        let env = service["environment"].as_hash().expect("environment");
        for key in env.keys() {
            proxy_help.names_env(key.as_str().unwrap());
        }
        // The route file is mounted where IDEMGATE_CONFIG says, from a file of
        // the repository, read-only.
        let config = env[&Yaml::String("IDEMGATE_CONFIG".into())]
            .as_str()
            .unwrap();
        assert_eq!(config, CONFIG_PATH);
        let mount = strings(&service["volumes"])
            .into_iter()
            .find(|volume| volume.contains(&format!(":{config}:")))
            .unwrap_or_else(|| panic!("{name} mounts nothing at {config}"));
        assert!(mount.ends_with(":ro"), "{mount}");
        let source = mount.split(':').next().unwrap();
        assert_route_file_starts_the_proxy(&read(source)).await;
        // The published ports are the image's; the admin listener only on loopback.
        for mapping in strings(&service["ports"]) {
            let container_port = mapping.rsplit(':').next().unwrap();
            assert!(
                exposed
                    .split_whitespace()
                    .any(|port| port == container_port),
                "{mapping}"
            );
            if container_port == "9901" {
                assert!(
                    mapping.starts_with("127.0.0.1:"),
                    "{name} publishes its admin port: {mapping}"
                );
            }
        }
        let grace = service["stop_grace_period"].as_str().unwrap();
        let grace: i64 = grace.trim_end_matches('s').parse().unwrap();
        assert!(
            grace > SHUTDOWN_TIMEOUT_SECONDS,
            "{name}: stop_grace_period {grace}s"
        );
    }
    assert_eq!(proxies, ["proxy", "proxy-redis"]);

    // Prometheus scrapes every proxy's admin port and loads the shipped rules,
    // mounted from deploy/prometheus.
    let prometheus = &services[&Yaml::String("prometheus".into())];
    assert_eq!(
        strings(&prometheus["volumes"]),
        ["./deploy/prometheus:/etc/prometheus:ro"]
    );
    let scrape = yaml("deploy/prometheus/prometheus.yml").remove(0);
    assert_eq!(strings(&scrape["rule_files"]), ["alerts.yml"]);
    let targets = strings(&scrape["scrape_configs"][0]["static_configs"][0]["targets"]);
    let expected: Vec<String> = proxies.iter().map(|name| format!("{name}:9901")).collect();
    assert_eq!(targets, expected);

    // Grafana: the dashboard is mounted where the provider looks, and the
    // provisioned datasource is of the type the dashboard's variable picks.
    let grafana = &services[&Yaml::String("grafana".into())];
    let volumes = strings(&grafana["volumes"]);
    let provider = yaml("deploy/grafana/provisioning/dashboards/idemgate.yml").remove(0);
    let folder = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    assert!(
        volumes.contains(&format!(
            "./deploy/grafana/idemgate.json:{folder}/idemgate.json:ro"
        )),
        "{volumes:?}"
    );
    assert!(
        volumes.contains(&"./deploy/grafana/provisioning:/etc/grafana/provisioning:ro".to_owned())
    );
    let datasource = yaml("deploy/grafana/provisioning/datasources/prometheus.yml").remove(0);
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/idemgate.json")).unwrap();
    assert_eq!(
        datasource["datasources"][0]["type"].as_str(),
        dashboard["templating"]["list"][0]["query"].as_str()
    );
}

// ---------------------------------------------------------------------------
// deploy/kubernetes

#[tokio::test]
async fn the_kubernetes_manifests_run_the_image_as_the_help_describes() {
    let image = Dockerfile::read();
    let help = Help::of("proxy");
    let docs: Vec<Yaml> = kubernetes_files()
        .iter()
        .flat_map(|path| {
            YamlLoader::load_from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        })
        .collect();
    let of_kind = |kind: &str| -> Vec<&Yaml> {
        docs.iter()
            .filter(|doc| doc["kind"].as_str() == Some(kind))
            .collect()
    };
    let routes = of_kind("ConfigMap")
        .into_iter()
        .find(|map| map["metadata"]["name"].as_str() == Some("idemgate-routes"))
        .expect("the idemgate-routes ConfigMap");
    let secret = of_kind("Secret")[0];
    let secret_name = secret["metadata"]["name"].as_str().unwrap();
    let secret_keys: BTreeSet<&str> = secret["stringData"]
        .as_hash()
        .unwrap()
        .keys()
        .map(|key| key.as_str().unwrap())
        .collect();
    let exposed: BTreeSet<i64> = image
        .one("EXPOSE")
        .split_whitespace()
        .map(|port| port.parse().unwrap())
        .collect();

    let deployments = of_kind("Deployment");
    assert_eq!(deployments.len(), 2, "the sidecar and the shared layouts");
    for deployment in deployments {
        let name = deployment["metadata"]["name"].as_str().unwrap();
        let pod = &deployment["spec"]["template"]["spec"];
        let labels = &deployment["spec"]["template"]["metadata"]["labels"];
        let container = pod["containers"]
            .as_vec()
            .unwrap()
            .iter()
            .find(|container| container["name"].as_str() == Some("idemgate"))
            .unwrap_or_else(|| panic!("{name} has no idemgate container"));
        assert_eq!(
            container["image"].as_str(),
            Some(format!("idemgate:{VERSION}").as_str())
        );
        assert_eq!(strings(&container["args"]), ["proxy"]);

        // Ports: the image's, named as the probes and the Service use them.
        let ports: BTreeMap<&str, i64> = container["ports"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|port| {
                (
                    port["name"].as_str().unwrap(),
                    port["containerPort"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            ports.values().copied().collect::<BTreeSet<_>>(),
            exposed,
            "{name}"
        );
        assert_eq!(
            ports["admin"],
            i64::from(help.default_of("--admin-listen").port())
        );
        assert_eq!(
            container["readinessProbe"]["httpGet"]["path"].as_str(),
            Some("/readyz")
        );
        assert_eq!(
            container["livenessProbe"]["httpGet"]["path"].as_str(),
            Some("/healthz")
        );
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(
                container[probe]["httpGet"]["port"].as_str(),
                Some("admin"),
                "{name} {probe}"
            );
        }
        assert!(
            container["resources"]["requests"]["cpu"].as_str().is_some(),
            "{name}"
        );

        // The user is the image's; the grace period outlasts the drain.
        assert_eq!(pod["securityContext"]["runAsUser"].as_i64(), Some(UID));
        let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
        let pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_i64()
            .unwrap_or(0);
        assert!(
            grace > SHUTDOWN_TIMEOUT_SECONDS + pause,
            "{name}: grace {grace}s"
        );

        // Environment: variables the proxy reads, secrets that exist, the route
        // file and the principal secret's file where their volumes put them.
        let mut env = BTreeMap::new();
        for var in container["env"].as_vec().unwrap() {
            let var_name = var["name"].as_str().unwrap();
            help.names_env(var_name);
            if let Some(key) = var["valueFrom"]["secretKeyRef"]["key"].as_str() {
                assert_eq!(
                    var["valueFrom"]["secretKeyRef"]["name"].as_str(),
                    Some(secret_name)
                );
                assert!(
                    secret_keys.contains(key),
                    "{name}: {var_name} from a missing key {key}"
                );
            }
            env.insert(var_name, var["value"].as_str().unwrap_or_default());
        }
        let mounts: BTreeMap<&str, &str> = container["volumeMounts"]
            .as_vec()
            .unwrap()
            .iter()
            .map(|mount| {
                (
                    mount["mountPath"].as_str().unwrap(),
                    mount["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(env["IDEMGATE_CONFIG"], CONFIG_PATH);
        let (dir, file) = CONFIG_PATH.rsplit_once('/').unwrap();
        let config_volume = volume(pod, mounts[dir]);
        assert_eq!(
            config_volume["configMap"]["name"].as_str(),
            Some("idemgate-routes")
        );
        assert!(
            routes["data"][file].as_str().is_some(),
            "the ConfigMap has no {file}"
        );
        let secret_file = env["IDEMGATE_PRINCIPAL_SECRET_FILE"];
        let (dir, file) = secret_file.rsplit_once('/').unwrap();
        let secret_volume = volume(pod, mounts[dir]);
        assert_eq!(
            secret_volume["secret"]["secretName"].as_str(),
            Some(secret_name)
        );
        let items = secret_volume["secret"]["items"].as_vec().unwrap();
        assert!(
            items.iter().any(|item| item["path"].as_str() == Some(file)
                && secret_keys.contains(item["key"].as_str().unwrap())),
            "{name}: nothing puts a secret at {secret_file}"
        );
        assert!(
            mounts.contains_key(image.one("WORKDIR").as_str()),
            "{name}: WORKDIR not writable"
        );

        // A Service sends its traffic to the proxy's port, and a budget covers
        // the pods.
        let selects = |doc: &Yaml, selector: &Yaml| {
            selector
                .as_hash()
                .unwrap()
                .iter()
                .all(|(key, value)| &labels[key.as_str().unwrap()] == value)
                && doc["metadata"]["namespace"] == deployment["metadata"]["namespace"]
        };
        let service = of_kind("Service")
            .into_iter()
            .find(|service| selects(service, &service["spec"]["selector"]))
            .unwrap_or_else(|| panic!("no Service selects {name}"));
        assert_eq!(
            service["spec"]["ports"][0]["targetPort"].as_str(),
            Some("http")
        );
        assert!(
            of_kind("PodDisruptionBudget")
                .into_iter()
                .any(|pdb| selects(pdb, &pdb["spec"]["selector"]["matchLabels"])),
            "no PodDisruptionBudget covers {name}"
        );
    }
    assert_route_file_starts_the_proxy(routes["data"]["routes.toml"].as_str().unwrap()).await;
}

// ---------------------------------------------------------------------------
// Helpers

/// Where the deployments mount the route file (`IDEMGATE_CONFIG`).
const CONFIG_PATH: &str = "/etc/idemgate/routes.toml";
const CONFIG_DIR: &str = "/etc/idemgate";
/// The image's user and group.
const UID: i64 = 10001;

/// The pod's volume `name`.
fn volume<'a>(pod: &'a Yaml, name: &str) -> &'a Yaml {
    pod["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .find(|volume| volume["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no volume {name}"))
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn read(relative: &str) -> String {
    let path = workspace().join(relative.trim_start_matches("./"));
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn yaml(relative: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(relative)).unwrap_or_else(|error| panic!("{relative}: {error}"))
}

fn strings(yaml: &Yaml) -> Vec<String> {
    yaml.as_vec()
        .unwrap_or_else(|| panic!("not a list: {yaml:?}"))
        .iter()
        .map(|item| item.as_str().unwrap().to_owned())
        .collect()
}

/// `key = "value"` in a TOML file, as written.
fn value_of(toml: &str, key: &str) -> String {
    toml.lines()
        .find_map(|line| line.strip_prefix(key)?.trim().strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}"))
        .trim()
        .trim_matches('"')
        .to_owned()
}

fn kubernetes_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(workspace().join("deploy/kubernetes"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    files
}

/// A validator from the project's own virtualenv.
fn tool(name: &str) -> PathBuf {
    let dir = std::env::var_os("IDEMGATE_DEPLOY_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/deploy-tools"));
    let path = dir.join("bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/services.sh deploy-tools (scripts/test.sh does)",
        path.display()
    );
    path
}

fn run_ok(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|error| panic!("{command:?} did not start: {error}"));
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// A subcommand's `--help`: the variables it reads and its defaults.
struct Help(String);

impl Help {
    fn of(subcommand: &str) -> Help {
        // Without the image's variables, so the defaults shown are the binary's.
        let out = run_ok(Command::new(BIN).args([subcommand, "--help"]).env_clear());
        // One space for every run of whitespace, so a wrapped line reads whole.
        Help(
            stdout(&out)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        )
    }

    fn names_env(&self, name: &str) {
        assert!(
            self.0.contains(&format!("[env: {name}="))
                || self.0.contains(&format!("[env: {name}]")),
            "the help does not name {name}:\n{}",
            self.0
        );
    }

    /// The `[default: …]` after `flag`'s line.
    fn default_text(&self, flag: &str) -> String {
        // The flag's own line: the flag followed by its value name.
        let at = self
            .0
            .find(&format!(" {flag} <"))
            .unwrap_or_else(|| panic!("no {flag}"));
        let rest = &self.0[at..];
        let start = rest.find("[default: ").unwrap() + "[default: ".len();
        rest[start..start + rest[start..].find(']').unwrap()].to_owned()
    }

    fn default_of(&self, flag: &str) -> SocketAddr {
        self.default_text(flag).parse().unwrap()
    }
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
struct Dockerfile(Vec<(String, String)>);

impl Dockerfile {
    fn read() -> Dockerfile {
        let mut instructions = Vec::new();
        let mut current = String::new();
        for line in read("Dockerfile").lines() {
            let line = line.trim();
            if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
                continue;
            }
            match line.strip_suffix('\\') {
                Some(part) => {
                    current.push_str(part.trim());
                    current.push(' ');
                }
                None => {
                    current.push_str(line);
                    let (word, args) = current.split_once(' ').unwrap_or((&current, ""));
                    instructions.push((word.to_owned(), args.trim().to_owned()));
                    current.clear();
                }
            }
        }
        Dockerfile(instructions)
    }

    /// Every instruction `word`, in every stage.
    fn all(&self, word: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(w, _)| w == word)
            .map(|(_, args)| args.clone())
            .collect()
    }

    /// The instructions of the last stage: what the image runs with.
    fn runtime(&self) -> impl Iterator<Item = &(String, String)> {
        let last_from = self
            .0
            .iter()
            .rposition(|(word, _)| word == "FROM")
            .expect("a FROM");
        self.0[last_from..].iter()
    }

    /// The one instruction `word` of the runtime stage (or `ARG NAME` of any
    /// stage, giving its default).
    fn one(&self, word: &str) -> String {
        if let Some(name) = word.strip_prefix("ARG ") {
            let args = self.all("ARG");
            let found = args
                .iter()
                .find_map(|arg| arg.strip_prefix(&format!("{name}=")));
            return found.unwrap_or_else(|| panic!("no ARG {name}")).to_owned();
        }
        let all: Vec<&String> = self
            .runtime()
            .filter(|(w, _)| w == word)
            .map(|(_, args)| args)
            .collect();
        assert_eq!(all.len(), 1, "{word}: {all:?}");
        all[0].clone()
    }

    /// The runtime stage's `ENV A=1 B=2` → {A: 1, B: 2}.
    fn env(&self) -> BTreeMap<String, String> {
        self.runtime()
            .filter(|(word, _)| word == "ENV")
            .map(|(_, args)| args)
            .flat_map(|args| {
                args.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap();
                (name.to_owned(), value.to_owned())
            })
            .collect()
    }
}

/// A route file the deployments ship: the proxy starts on it, and refuses it
/// spoilt (exit 2), so the start is what checks it.
async fn assert_route_file_starts_the_proxy(routes: &str) {
    let dir = TempDir::new("idemgate-packaging-routes");
    let file = dir.path().join("routes.toml");
    std::fs::write(&file, routes).unwrap();
    let vars = BTreeMap::from([
        ("IDEMGATE_LISTEN".to_owned(), "127.0.0.1:0".to_owned()),
        ("IDEMGATE_ADMIN_LISTEN".to_owned(), "127.0.0.1:0".to_owned()),
        ("IDEMGATE_IDEMPOTENCY_STORE".to_owned(), "memory".to_owned()),
    ]);
    let proxy = Running::proxy(dir.path(), &vars, Some(&file));
    proxy.expect(&format!("{}/healthz", proxy.admin), 200).await;
    drop(proxy);

    std::fs::write(
        &file,
        format!("{routes}\n[[route]]\nmethod = \"POST\"\npath = \"/x\"\nretry = 1\n"),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("proxy")
        .env_clear()
        .envs(&vars)
        .env("IDEMGATE_UPSTREAM", "http://127.0.0.1:9")
        .env("IDEMGATE_PRINCIPAL_SECRET", "packaging-test-secret")
        .env("IDEMGATE_CONFIG", &file)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a spoilt route file: {out:?}");
}

/// An `idemgate proxy` of this test, killed when dropped.
struct Running {
    child: Child,
    admin: String,
}

impl Running {
    fn proxy(dir: &Path, vars: &BTreeMap<String, String>, config: Option<&Path>) -> Running {
        let mut command = Command::new(BIN);
        command
            .arg("proxy")
            .env_clear()
            .envs(vars)
            .env("IDEMGATE_UPSTREAM", "http://127.0.0.1:9")
            .env("IDEMGATE_PRINCIPAL_SECRET", "packaging-test-secret")
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(config) = config {
            command.env("IDEMGATE_CONFIG", config);
        }
        let mut child = command.spawn().unwrap();
        let (lines, received) = mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = lines.send(line);
                }
            });
        }
        // Only the readers hold senders now: a proxy that exits ends the wait.
        drop(lines);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        let admin = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match received.recv_timeout(left) {
                Ok(line) => {
                    const MARK: &str = "admin listening on http://";
                    if let Some(at) = line.find(MARK) {
                        let rest = &line[at + MARK.len()..];
                        let end = rest
                            .find(|c: char| c == '"' || c.is_whitespace())
                            .unwrap_or(rest.len());
                        break format!("http://{}", &rest[..end]);
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait();
                    panic!(
                        "the proxy never said where its admin listens ({status:?}):\n{}",
                        seen.join("\n")
                    );
                }
            }
        };
        Running { child, admin }
    }

    async fn expect(&self, url: &str, status: u16) {
        let response = reqwest::get(url)
            .await
            .unwrap_or_else(|error| panic!("{url}: {error}"));
        assert_eq!(response.status().as_u16(), status, "{url}");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory of this test's, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
