//! The resolved routes as services, and the dispatcher that picks one per
//! request: each route is the one idempotency layer (its store, its
//! detached-task tracker) configured by the route's [`Policy`] around the
//! forwarder; the default route, the command line's policy, is last and takes
//! every request no route matched.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::body::Body;
use axum::response::IntoResponse;
use http::{Method, Request, Response};
use idemgate::path::PathFold;
use idemgate::problem::ProblemStyle;
use idemgate::{Idempotency, IdempotencyLayer, ProblemDetails};
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use super::file::Routes;
use super::pattern::RoutePattern;
use super::policy::{Conditional, Policy};
use crate::conditional;
use crate::encoding::Accepted;
use crate::forward::Forward;
use crate::guard::{self, Guard, MethodOverride, SafeMethodBodies};
use crate::problem;

/// What turns policies into dispatchable routes: the base layer and forwarder
/// every route configures, and the default route's policy.
#[derive(Clone)]
pub(crate) struct RouteBuilder {
    /// The layer as the operator built it: store, principal, problem base.
    pub(crate) idempotency: IdempotencyLayer,
    pub(crate) forward: Forward,
    /// The upstream's response-head timeout: the body's idle bound where a
    /// policy sets none.
    pub(crate) upstream_timeout: Duration,
    /// The default route: what a request no route matches gets.
    pub(crate) defaults: Policy,
    /// Where `conditional = "enforce"` routes take their resource leases.
    pub(crate) lock_store: Option<conditional::LockStore>,
}

impl RouteBuilder {
    /// `routes` in file order, then the default route.
    fn build(&self, routes: &Routes) -> Table {
        let routes = routes
            .iter()
            .map(|route| {
                let policy = self.defaults.overlaid(&route.overrides);
                self.route(
                    Some(RouteMatch {
                        method: route.method.clone(),
                        pattern: route.pattern.folded(policy.fold()),
                    }),
                    &policy,
                    Some(&route.pattern),
                )
            })
            .collect();
        Table {
            routes,
            default: self.route(None, &self.defaults, None),
        }
    }

    /// One route: `policy` configuring the layer and the forwarder; covering
    /// `matched`'s method only (every method the layer covers by default for
    /// the default route), named by `template`.
    fn route(
        &self,
        matched: Option<RouteMatch>,
        policy: &Policy,
        template: Option<&RoutePattern>,
    ) -> DispatchRoute {
        let mut layer = policy.layer(&self.idempotency);
        match (&matched, policy.enabled) {
            (Some(route), true) => layer = layer.with_methods([route.method.clone()]),
            (None, true) => {}
            (_, false) => layer = layer.with_methods([]),
        }
        // Named for every declared route: the route's execution history and its
        // journal entries go by it. The layer scopes by it only where the key
        // asks (a path key, content dedup).
        if let Some(template) = template {
            layer = layer.with_route_template(template.to_string());
        }
        let enforce = match policy.conditional {
            Conditional::Off => None,
            Conditional::Enforce | Conditional::RequireIfMatch => Some(conditional::Enforce {
                store: self.lock_store.as_ref().map(|store| Arc::clone(&store.0)),
                require_if_match: policy.conditional == Conditional::RequireIfMatch,
            }),
        };
        let upstream = conditional::Enforcing::new(
            policy.forward(&self.forward, self.upstream_timeout),
            enforce,
        );
        DispatchRoute {
            matched,
            fold: policy.fold(),
            method_override: policy.method_override,
            safe_method_bodies: policy.safe_method_bodies,
            service: layer.layer(upstream),
        }
    }

    /// The problem style of refusals made before the layer: the default route's.
    pub(crate) fn style(&self) -> ProblemStyle {
        self.defaults
            .layer(&self.idempotency)
            .problem_style()
            .clone()
    }
}

/// The routes a running proxy dispatches to, replaceable as a whole while it
/// serves (`idemgate proxy` on `SIGHUP`). A replacement is atomic: each request
/// reads the table once, when it is dispatched, and keeps the route service it
/// got to its end, so a request in flight finishes under the routes it started
/// with and the next one sees only the new table, never a mix. Every route of a
/// new table is the same layer as before (the same store, the same
/// detached-task tracker) with the new file's settings.
#[derive(Clone)]
pub struct RouteTable {
    builder: Arc<RouteBuilder>,
    routes: Arc<ArcSwap<Table>>,
}

impl fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable")
            .field("routes", &self.len())
            .finish_non_exhaustive()
    }
}

impl RouteTable {
    /// The table of `routes` (with the default route last), and the dispatcher
    /// that reads it, admitting each request through `guard` first.
    pub(crate) fn new(builder: RouteBuilder, routes: &Routes, guard: Guard) -> (Self, Proxy) {
        let table = Self {
            routes: Arc::new(ArcSwap::from_pointee(builder.build(routes))),
            builder: Arc::new(builder),
        };
        let proxy = Proxy {
            style: table.builder.style(),
            guard: Arc::new(guard),
            routes: Arc::clone(&table.routes),
        };
        (table, proxy)
    }

    /// Dispatches every request from now on by `routes`, each over the default
    /// route's policy ([`RouteTable::defaults`], which [`Routes::from_toml`]
    /// checked them against: building a route cannot fail).
    pub fn replace(&self, routes: &Routes) {
        self.routes.store(Arc::new(self.builder.build(routes)));
    }

    /// The default route's policy, which a new route file is resolved over.
    pub fn defaults(&self) -> &Policy {
        &self.builder.defaults
    }

    /// How many routes the current table has (the default route not counted).
    pub fn len(&self) -> usize {
        self.routes.load().routes.len()
    }

    /// Whether the current table has no route (every request gets the defaults).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The routes a request is tried against, in order: a file's, then the
/// default route, which matches every request.
#[derive(Debug)]
struct Table {
    routes: Vec<DispatchRoute>,
    default: DispatchRoute,
}

impl Table {
    /// The first route that matches a request of `method` to the canonical
    /// `path`: a file's route, else the default.
    fn route(&self, method: &Method, path: &str) -> &DispatchRoute {
        self.routes
            .iter()
            .find(|route| route.matches(method, path))
            .unwrap_or(&self.default)
    }
}

/// What a route matches: a method and a path pattern (folded as the route's
/// paths are).
#[derive(Clone, Debug)]
struct RouteMatch {
    method: Method,
    pattern: RoutePattern,
}

/// One route, ready to dispatch to: what it matches and what it decides before
/// the layer.
#[derive(Clone, Debug)]
struct DispatchRoute {
    /// `None`: every request (the default route, last in the table).
    matched: Option<RouteMatch>,
    fold: PathFold,
    method_override: MethodOverride,
    safe_method_bodies: SafeMethodBodies,
    service: Idempotency<conditional::Enforcing>,
}

impl DispatchRoute {
    fn matches(&self, method: &Method, path: &str) -> bool {
        self.matched.as_ref().is_none_or(|route| {
            route.method == method && route.pattern.matches(&self.fold.apply(path))
        })
    }
}

/// The proxy as one service: brings each request to one reading (the guard),
/// then sends it to the service of the first route that matches it — a file's
/// route, else the default route. It owns every path, so a listener serves it
/// as it is ([`crate::reloadable_app`]); [`crate::app`] puts it behind an axum
/// router for an application that nests it. Cloning it is three reference
/// counts.
#[derive(Clone, Debug)]
pub struct Proxy {
    /// The default route's problem style, for the refusals made before the layer.
    style: ProblemStyle,
    guard: Arc<Guard>,
    /// Read once per request ([`RouteTable`]).
    routes: Arc<ArcSwap<Table>>,
}

impl Proxy {
    /// The service for `request`, once it is in the spelling everyone reads; or
    /// the problem it is refused with.
    fn route(
        &self,
        request: &mut Request<Body>,
    ) -> Result<Idempotency<conditional::Enforcing>, ProblemDetails> {
        let admitted = self.guard.admit(request)?;
        let method = admitted
            .overridden
            .clone()
            .unwrap_or_else(|| request.method().clone());
        let table = self.routes.load();
        let route = table.route(&method, admitted.path.as_str());
        if let Some(overridden) = admitted.overridden {
            if route.method_override == MethodOverride::Refuse {
                return Err(problem::ambiguous_method(format!(
                    "a method-override header names {overridden} for this {} request, which this route does not honour",
                    request.method()
                )));
            }
            guard::honour_override(request, overridden);
        }
        if route.safe_method_bodies == SafeMethodBodies::Refuse
            && guard::has_safe_method_content(request)
        {
            return Err(problem::unexpected_body(request.method()));
        }
        guard::rewrite_target(request, &admitted.path);
        Ok(route.service.clone())
    }
}

impl Service<Request<Body>> for Proxy {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Each call readies the service it picks (oneshot).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        match self.route(&mut request) {
            Ok(service) => {
                let accepted = Accepted::of(request.headers());
                Box::pin(async move {
                    let response = service.oneshot(request).await?;
                    Ok(accepted.encode(response).await)
                })
            }
            Err(problem) => {
                tracing::debug!(problem = %problem.type_uri, "request refused before the layer");
                Box::pin(std::future::ready(Ok(self
                    .style
                    .restyle(problem.into_response()))))
            }
        }
    }
}
