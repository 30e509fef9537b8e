//! Running the checker, and traces as readable steps.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model, Path, UniformChooser};

/// A path of the model: its states and the actions between them.
pub type Trace<M> = Path<<M as Model>::State, <M as Model>::Action>;

/// What one run of the checker saw.
pub struct Outcome<M: Model> {
    /// What ran: "exhaustive breadth-first" or "random walks".
    pub search: &'static str,
    /// States generated, repeats included.
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// Deepest path explored.
    pub max_depth: usize,
    /// Wall-clock time.
    pub elapsed: Duration,
    /// Counterexamples of `always` properties, by property.
    pub counterexamples: Vec<(&'static str, Trace<M>)>,
    /// `sometimes` properties no example was found for.
    pub never_reached: Vec<&'static str>,
}

impl<M: Model> std::fmt::Debug for Outcome<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("search", &self.search)
            .field("states", &self.states)
            .field("unique_states", &self.unique_states)
            .field("max_depth", &self.max_depth)
            .field("elapsed", &self.elapsed)
            .field(
                "counterexamples",
                &self
                    .counterexamples
                    .iter()
                    .map(|(name, _)| name)
                    .collect::<Vec<_>>(),
            )
            .field("never_reached", &self.never_reached)
            .finish()
    }
}

impl<M: Model> Outcome<M> {
    /// One line of figures, as the tests print it.
    pub fn summary(&self, name: &str) -> String {
        format!(
            "[model] {name}: {}, {} states ({} unique), depth {}, {:.1?}",
            self.search, self.states, self.unique_states, self.max_depth, self.elapsed
        )
    }

    /// The counterexample of `property`, if one was found.
    pub fn counterexample(&self, property: &str) -> Option<&Trace<M>> {
        self.counterexamples
            .iter()
            .find(|(name, _)| *name == property)
            .map(|(_, path)| path)
    }
}

fn outcome<M, C>(
    search: &'static str,
    model_properties: &[stateright::Property<M>],
    checker: &C,
    started: Instant,
) -> Outcome<M>
where
    M: Model,
    M::State: Clone + PartialEq,
    M::Action: Clone + PartialEq,
    C: Checker<M>,
{
    let discoveries = checker.discoveries();
    let mut counterexamples = Vec::new();
    let mut never_reached = Vec::new();
    for property in model_properties {
        let found = discoveries.get(property.name);
        match (property.expectation.discovery_is_failure(), found) {
            (true, Some(path)) => counterexamples.push((property.name, path.clone())),
            (false, None) => never_reached.push(property.name),
            _ => {}
        }
    }
    Outcome {
        search,
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed: started.elapsed(),
        counterexamples,
        never_reached,
    }
}

/// Explores every reachable state breadth-first on `threads` threads, so a
/// counterexample is a shortest one. With `stop_at`, stops as soon as that
/// property has a discovery (the guard tests).
pub fn exhaustive<M>(model: M, threads: usize, stop_at: Option<&'static str>) -> Outcome<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq,
{
    let properties = model.properties();
    let started = Instant::now();
    let mut builder = model.checker().threads(threads);
    if let Some(name) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])));
    }
    let checker = builder.spawn_bfs().join();
    outcome("exhaustive breadth-first", &properties, &checker, started)
}

/// Explores every reachable state depth-first on `threads` threads, visiting
/// one state of each class `representative` maps to one (symmetry reduction).
pub fn exhaustive_up_to<M>(
    model: M,
    threads: usize,
    representative: fn(&M::State) -> M::State,
) -> Outcome<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq,
{
    let properties = model.properties();
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads)
        .symmetry_fn(representative)
        .spawn_dfs()
        .join();
    outcome(
        "exhaustive depth-first, up to symmetry",
        &properties,
        &checker,
        started,
    )
}

/// Random walks (stateright's simulation) from `seed`, each at most `depth`
/// steps, until `budget` has passed.
pub fn random_walks<M>(
    model: M,
    threads: usize,
    seed: u64,
    depth: usize,
    budget: Duration,
) -> Outcome<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq,
{
    let properties = model.properties();
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads)
        .target_max_depth(depth)
        .timeout(budget)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_simulation(seed, UniformChooser)
        .join();
    outcome("random walks", &properties, &checker, started)
}

/// A path as numbered, readable steps, each from the model's `format_step`.
pub fn trace<M>(model: &M, path: &Path<M::State, M::Action>) -> String
where
    M: Model,
    M::State: Clone + Debug,
    M::Action: Clone + Debug,
{
    let mut out = String::new();
    let steps = path.clone().into_vec();
    let mut number = 0;
    for (state, action) in steps {
        let Some(action) = action else { continue };
        number += 1;
        let line = model
            .format_step(&state, action.clone())
            .unwrap_or_else(|| format!("{action:?}"));
        out.push_str(&format!("{number:>3}. {line}\n"));
    }
    out
}
