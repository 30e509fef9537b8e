//! No import circle between the modules of one crate (CONTRIBUTING, "Layers of
//! the binary": each module imports only modules below it).
//!
//! Every workspace crate's module trees (`src/lib.rs`, `src/main.rs`,
//! `src/bin/*`, followed through their `mod` declarations) are parsed with
//! `syn`, and each module's references to other modules of the same crate —
//! `use` items and paths in code that start with `crate::`, `super::`, `self::`
//! or a child module's name — become arrows between files. A name is followed
//! through the `use` that brought it into a module (a re-export is a door, not
//! a room: `crate::Listener` is an arrow to the module that defines `Listener`,
//! not to `lib.rs`). The test fails naming every circle, file by file, with the
//! paths that tie each arrow.
//!
//! What is not an arrow: a `mod` declaration (a parent holds its children), an
//! item under `#[cfg(test)]` (unit tests may reach anywhere in their crate, as a
//! crate's integration tests do), paths inside macro invocations (not parsed),
//! and anything from another crate. An inline `mod` is part of its file: its
//! arrows are its file's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A file's arrows: to each file, the paths (as written) that make it.
type Graph = BTreeMap<PathBuf, BTreeMap<PathBuf, BTreeSet<String>>>;

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/")
        .to_path_buf();
    let mut roots = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("read crates/") {
        let src = entry.expect("crates/ entry").path().join("src");
        for root in ["lib.rs", "main.rs"] {
            if src.join(root).is_file() {
                roots.push(src.join(root));
            }
        }
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            for bin in bins {
                let bin = bin.expect("bin/ entry").path();
                if bin.extension().is_some_and(|ext| ext == "rs") {
                    roots.push(bin);
                } else if bin.join("main.rs").is_file() {
                    roots.push(bin.join("main.rs"));
                }
            }
        }
    }
    roots.sort();
    let mut files = 0;
    let mut found = Vec::new();
    for root in &roots {
        let tree = Tree::load(root, |path| std::fs::read_to_string(path).ok());
        files += tree.files();
        for circle in find_circles(&tree.graph()) {
            let members: BTreeSet<String> = circle
                .iter()
                .map(|(file, _)| relative(file, &crates))
                .collect();
            found.push((members, describe(&circle, &crates)));
        }
    }
    // Not vacuous: the workspace has well over a hundred module files.
    assert!(roots.len() >= 10, "crate roots found: {roots:?}");
    assert!(files >= 100, "only {files} module files were read");
    let circles: Vec<&str> = found
        .iter()
        .map(|(_, description)| description.as_str())
        .collect();
    assert!(
        circles.is_empty(),
        "import circles between modules of one crate:\n{}",
        circles.join("\n")
    );
}

/// `path` relative to `base`, as text.
fn relative(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// One module: a file, or an inline `mod` inside one.
#[derive(Debug)]
struct Module {
    /// The file it is written in.
    file: PathBuf,
    /// Where the files of its `mod x;` children are.
    dir: PathBuf,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// The names its `use` items bind, each to the path it names (from this module).
    bindings: BTreeMap<String, Vec<String>>,
    /// Paths in its code that may name a module of the crate.
    references: Vec<Vec<String>>,
}

/// One crate's module tree.
#[derive(Debug)]
struct Tree {
    modules: Vec<Module>,
}

impl Tree {
    /// The tree whose root file is `root`, its files read by `read` (`None`: no
    /// such file).
    fn load(root: &Path, read: impl Fn(&Path) -> Option<String>) -> Self {
        let mut tree = Self {
            modules: vec![Module {
                file: root.to_path_buf(),
                dir: root.parent().expect("a root has a folder").to_path_buf(),
                parent: None,
                children: BTreeMap::new(),
                bindings: BTreeMap::new(),
                references: Vec::new(),
            }],
        };
        let mut pending = vec![0];
        while let Some(module) = pending.pop() {
            let file = tree.modules[module].file.clone();
            let source = read(&file).unwrap_or_else(|| panic!("cannot read {}", file.display()));
            let parsed = syn::parse_file(&source)
                .unwrap_or_else(|error| panic!("{} does not parse: {error}", file.display()));
            let mut collector = Collector {
                tree: &mut tree,
                stack: vec![module],
                declared: Vec::new(),
            };
            collector.visit_file(&parsed);
            for (child, path) in collector.declared {
                let found = path.into_iter().find(|path| read(path).is_some());
                let Some(found) = found else {
                    panic!(
                        "{}: `mod {}` has no file",
                        file.display(),
                        tree.modules[child].dir.display()
                    );
                };
                tree.modules[child].dir = child_dir(&found);
                tree.modules[child].file = found;
                pending.push(child);
            }
        }
        tree
    }

    /// How many files its modules are written in.
    fn files(&self) -> usize {
        self.modules
            .iter()
            .map(|module| &module.file)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// The arrows between its files.
    fn graph(&self) -> Graph {
        let mut graph = Graph::new();
        for (id, module) in self.modules.iter().enumerate() {
            graph.entry(module.file.clone()).or_default();
            for reference in &module.references {
                let Some(target) = self.resolve(id, reference, 0) else {
                    continue;
                };
                let to = &self.modules[target].file;
                if *to != module.file && !self.is_ancestor(target, id) {
                    graph
                        .entry(module.file.clone())
                        .or_default()
                        .entry(to.clone())
                        .or_default()
                        .insert(reference.join("::"));
                }
            }
        }
        graph
    }

    /// Whether `module` declares `of`, or declares a module that does.
    fn is_ancestor(&self, module: usize, of: usize) -> bool {
        let mut at = self.modules[of].parent;
        while let Some(parent) = at {
            if parent == module {
                return true;
            }
            at = self.modules[parent].parent;
        }
        false
    }

    /// The module `path` (as written in module `from`) names, or lies in;
    /// `None` for another crate's.
    fn resolve(&self, from: usize, path: &[String], depth: usize) -> Option<usize> {
        let (first, rest) = path.split_first()?;
        let module = &self.modules[from];
        let start = match first.as_str() {
            "crate" => 0,
            "super" => module.parent?,
            "self" => from,
            name => {
                if let Some(&child) = module.children.get(name) {
                    child
                } else if let Some(bound) = module.bindings.get(name) {
                    return self.follow(from, bound, rest, depth);
                } else {
                    return None;
                }
            }
        };
        self.walk(start, rest, depth)
    }

    /// From module `at`, down `rest`: as far as its segments are modules, then
    /// through a `use` binding, else the module that defines the name.
    fn walk(&self, mut at: usize, rest: &[String], depth: usize) -> Option<usize> {
        for (i, segment) in rest.iter().enumerate() {
            let module = &self.modules[at];
            match segment.as_str() {
                "self" => {}
                "super" => at = module.parent?,
                name => {
                    if let Some(&child) = module.children.get(name) {
                        at = child;
                    } else if let Some(bound) = module.bindings.get(name) {
                        return self.follow(at, bound, &rest[i + 1..], depth);
                    } else {
                        return Some(at);
                    }
                }
            }
        }
        Some(at)
    }

    /// A name bound in module `at` to `bound`, then `rest`; `None` when it is
    /// another crate's (a re-export of a dependency is no arrow). Bounded: a
    /// chain of re-exports is short, and a loop of them does not compile.
    fn follow(&self, at: usize, bound: &[String], rest: &[String], depth: usize) -> Option<usize> {
        if depth > 16 {
            return Some(at);
        }
        let path: Vec<String> = bound.iter().chain(rest).cloned().collect();
        self.resolve(at, &path, depth + 1)
    }
}

/// Where the children of the module written in `file` are: beside a
/// `lib.rs`/`main.rs`/`mod.rs`, in the folder named after any other file.
fn child_dir(file: &Path) -> PathBuf {
    let dir = file.parent().expect("a file has a folder");
    match file.file_stem().and_then(|stem| stem.to_str()) {
        Some("lib" | "main" | "mod") => dir.to_path_buf(),
        Some(stem) => dir.join(stem),
        None => dir.to_path_buf(),
    }
}

/// Walks one file, adding its inline modules and declared children to the tree.
struct Collector<'a> {
    tree: &'a mut Tree,
    /// The module being walked, innermost last.
    stack: Vec<usize>,
    /// Children declared `mod x;`, with the files they may be in.
    declared: Vec<(usize, Vec<PathBuf>)>,
}

impl Collector<'_> {
    fn current(&self) -> usize {
        *self.stack.last().expect("inside a module")
    }

    fn add_child(&mut self, name: &str, dir: PathBuf) -> usize {
        let parent = self.current();
        let id = self.tree.modules.len();
        let file = self.tree.modules[parent].file.clone();
        self.tree.modules.push(Module {
            file,
            dir,
            parent: Some(parent),
            children: BTreeMap::new(),
            bindings: BTreeMap::new(),
            references: Vec::new(),
        });
        self.tree.modules[parent]
            .children
            .insert(name.to_owned(), id);
        id
    }

    /// Each leaf of a `use` tree: a binding (unless a glob) and a reference.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        let module = self.current();
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let name = name.ident.to_string();
                let mut path = prefix.clone();
                if name != "self" {
                    path.push(name.clone());
                }
                let bound = if name == "self" {
                    prefix.last().cloned().unwrap_or_default()
                } else {
                    name
                };
                self.bind(module, bound, path);
            }
            syn::UseTree::Rename(rename) => {
                let mut path = prefix.clone();
                if rename.ident != "self" {
                    path.push(rename.ident.to_string());
                }
                self.bind(module, rename.rename.to_string(), path);
            }
            syn::UseTree::Glob(_) => {
                self.tree.modules[module].references.push(prefix.clone());
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    fn bind(&mut self, module: usize, name: String, path: Vec<String>) {
        let module = &mut self.tree.modules[module];
        module.references.push(path.clone());
        if name != "_" {
            module.bindings.insert(name, path);
        }
    }
}

/// Whether `attrs` hold `#[cfg(…test…)]`: a unit test's item.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr.meta.require_list().is_ok_and(|list| {
                list.tokens
                    .to_string()
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|word| word == "test")
            })
    })
}

/// The `#[path = "…"]` of a `mod` declaration.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| match &attr.meta {
        syn::Meta::NameValue(value) if value.path.is_ident("path") => match &value.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(path),
                ..
            }) => Some(path.value()),
            _ => None,
        },
        _ => None,
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(item) => &item.attrs,
        syn::Item::Enum(item) => &item.attrs,
        syn::Item::ExternCrate(item) => &item.attrs,
        syn::Item::Fn(item) => &item.attrs,
        syn::Item::ForeignMod(item) => &item.attrs,
        syn::Item::Impl(item) => &item.attrs,
        syn::Item::Macro(item) => &item.attrs,
        syn::Item::Mod(item) => &item.attrs,
        syn::Item::Static(item) => &item.attrs,
        syn::Item::Struct(item) => &item.attrs,
        syn::Item::Trait(item) => &item.attrs,
        syn::Item::TraitAlias(item) => &item.attrs,
        syn::Item::Type(item) => &item.attrs,
        syn::Item::Union(item) => &item.attrs,
        syn::Item::Use(item) => &item.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(item) => &item.attrs,
            syn::ImplItem::Fn(item) => &item.attrs,
            syn::ImplItem::Type(item) => &item.attrs,
            syn::ImplItem::Macro(item) => &item.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        let name = item.ident.to_string();
        let dir = self.tree.modules[self.current()].dir.clone();
        match &item.content {
            Some((_, items)) => {
                let id = self.add_child(&name, dir.join(&name));
                self.stack.push(id);
                for item in items {
                    self.visit_item(item);
                }
                self.stack.pop();
            }
            None => {
                let candidates = match path_attr(&item.attrs) {
                    Some(path) => {
                        let file = &self.tree.modules[self.current()].file;
                        vec![file.parent().expect("a file has a folder").join(path)]
                    }
                    None => vec![
                        dir.join(format!("{name}.rs")),
                        dir.join(&name).join("mod.rs"),
                    ],
                };
                let id = self.add_child(&name, dir.join(&name));
                self.declared.push((id, candidates));
            }
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments = path
                .segments
                .iter()
                .map(|segment| segment.ident.to_string())
                .collect();
            let module = self.current();
            self.tree.modules[module].references.push(segments);
        }
        syn::visit::visit_path(self, path);
    }
}

/// Every circle of `graph`: one per strongly connected component of more than
/// one file, as a loop of files (the first again at the end).
fn find_circles(graph: &Graph) -> Vec<Vec<(PathBuf, BTreeSet<String>)>> {
    let nodes: Vec<&PathBuf> = graph.keys().collect();
    let index: BTreeMap<&PathBuf, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let edges: Vec<Vec<usize>> = nodes
        .iter()
        .map(|node| {
            graph[*node]
                .keys()
                .filter_map(|to| index.get(to).copied())
                .collect()
        })
        .collect();
    let mut circles = Vec::new();
    for component in strongly_connected(&edges) {
        if component.len() < 2 {
            continue;
        }
        let members: BTreeSet<usize> = component.iter().copied().collect();
        let start = *members.first().expect("not empty");
        let cycle = shortest_loop(&edges, &members, start);
        let mut circle = Vec::new();
        for pair in cycle.windows(2) {
            let (from, to) = (nodes[pair[0]], nodes[pair[1]]);
            circle.push((from.clone(), graph[from][to].clone()));
        }
        circle.push((nodes[start].clone(), BTreeSet::new()));
        circles.push(circle);
    }
    circles
}

/// Tarjan's strongly connected components of `edges` (node → successors).
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        components: Vec<Vec<usize>>,
    }
    fn visit(state: &mut State<'_>, node: usize) {
        state.index[node] = Some(state.next);
        state.low[node] = state.next;
        state.next += 1;
        state.stack.push(node);
        state.on_stack[node] = true;
        for &next in &state.edges[node] {
            match state.index[next] {
                None => {
                    visit(state, next);
                    state.low[node] = state.low[node].min(state.low[next]);
                }
                Some(index) if state.on_stack[next] => {
                    state.low[node] = state.low[node].min(index);
                }
                Some(_) => {}
            }
        }
        if Some(state.low[node]) == state.index[node] {
            let mut component = Vec::new();
            loop {
                let member = state.stack.pop().expect("on the stack");
                state.on_stack[member] = false;
                component.push(member);
                if member == node {
                    break;
                }
            }
            state.components.push(component);
        }
    }
    let mut state = State {
        edges,
        index: vec![None; edges.len()],
        low: vec![0; edges.len()],
        on_stack: vec![false; edges.len()],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for node in 0..edges.len() {
        if state.index[node].is_none() {
            visit(&mut state, node);
        }
    }
    state.components
}

/// The shortest loop from `start` back to it within `members` (breadth first).
fn shortest_loop(edges: &[Vec<usize>], members: &BTreeSet<usize>, start: usize) -> Vec<usize> {
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &next in &edges[node] {
            if !members.contains(&next) {
                continue;
            }
            if next == start {
                let mut path = vec![start, node];
                let mut at = node;
                while at != start {
                    at = came_from[&at];
                    path.push(at);
                }
                path.reverse();
                return path;
            }
            if next != start && !came_from.contains_key(&next) {
                came_from.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    unreachable!("a strongly connected component of two or more has a loop through each member")
}

/// A circle as lines: `a.rs -> b.rs  (crate::b::X)` …, paths relative to `base`.
fn describe(circle: &[(PathBuf, BTreeSet<String>)], base: &Path) -> String {
    let name = |path: &Path| {
        path.strip_prefix(base)
            .unwrap_or(path)
            .display()
            .to_string()
    };
    let mut lines = vec![format!("circle through {} files:", circle.len() - 1)];
    for pair in circle.windows(2) {
        let ((from, paths), (to, _)) = (&pair[0], &pair[1]);
        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
        lines.push(format!(
            "  {} -> {}  ({})",
            name(from),
            name(to),
            paths.join(", ")
        ));
    }
    lines.join("\n")
}

// --- The finder itself -------------------------------------------------------------

/// `files` (path → source) as a crate rooted at `src/lib.rs`, and its circles.
fn circles_of(files: &[(&str, &str)]) -> Vec<String> {
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(path, source)| (PathBuf::from(path), (*source).to_owned()))
        .collect();
    let tree = Tree::load(Path::new("src/lib.rs"), |path| files.get(path).cloned());
    find_circles(&tree.graph())
        .iter()
        .map(|circle| describe(circle, Path::new("")))
        .collect()
}

#[test]
fn a_loop_in_a_tiny_graph_is_found_and_a_tail_is_not_part_of_it() {
    let file = |name: &str| PathBuf::from(name);
    let mut graph = Graph::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a"), ("c", "e")] {
        graph
            .entry(file(from))
            .or_default()
            .insert(file(to), BTreeSet::from([format!("crate::{to}")]));
        graph.entry(file(to)).or_default();
    }
    let circles = find_circles(&graph);
    assert_eq!(circles.len(), 1, "{circles:?}");
    let files: Vec<&PathBuf> = circles[0].iter().map(|(file, _)| file).collect();
    assert_eq!(files, [&file("a"), &file("b"), &file("c"), &file("a")]);
    assert_eq!(
        describe(&circles[0], Path::new("")),
        "circle through 3 files:\n  a -> b  (crate::b)\n  b -> c  (crate::c)\n  c -> a  (crate::a)"
    );
}

#[test]
fn siblings_that_reach_each_other_through_their_parent_are_a_circle() {
    let circles = circles_of(&[
        ("src/lib.rs", "mod routes;"),
        (
            "src/routes.rs",
            "mod dispatch; mod pattern; pub use pattern::Pattern;",
        ),
        (
            "src/routes/pattern.rs",
            "pub struct Pattern; pub fn parse() -> super::dispatch::Route { todo!() }",
        ),
        (
            "src/routes/dispatch.rs",
            "use super::Pattern; pub struct Route(Pattern);",
        ),
    ]);
    assert_eq!(
        circles,
        [
            "circle through 2 files:\n  src/routes/dispatch.rs -> src/routes/pattern.rs  (super::Pattern)\n  src/routes/pattern.rs -> src/routes/dispatch.rs  (super::dispatch::Route)"
        ]
    );
}

#[test]
fn a_child_may_use_what_its_parent_defines() {
    // The parent declares and wires its children; a child taking the parent's
    // own types (`super::Policy`, a type the crate root defines) is the tree's
    // shape, not a circle.
    let circles = circles_of(&[
        (
            "src/lib.rs",
            "mod routes; pub struct Error; fn f() { routes::load(); }",
        ),
        (
            "src/routes.rs",
            "mod pattern; pub struct Policy; pub fn load() { pattern::parse(); }",
        ),
        (
            "src/routes/pattern.rs",
            "use super::Policy; use crate::Error; pub fn parse() {}",
        ),
    ]);
    assert!(circles.is_empty(), "{circles:?}");
}

#[test]
fn a_circle_through_code_paths_and_nested_folders_is_found() {
    let circles = circles_of(&[
        ("src/lib.rs", "pub mod a; mod b;"),
        ("src/a/mod.rs", "pub mod deep;"),
        ("src/a/deep.rs", "pub fn go() { crate::b::back() }"),
        (
            "src/b.rs",
            "pub fn back() {} fn x() -> crate::a::deep::Thing { todo!() }",
        ),
    ]);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0].contains("src/a/deep.rs -> src/b.rs  (crate::b::back)"),
        "{}",
        circles[0]
    );
}

#[test]
fn re_exports_tests_and_other_crates_make_no_circle() {
    let circles = circles_of(&[
        (
            "src/lib.rs",
            "mod accept; mod options; pub use accept::Listener; pub use options::Options;",
        ),
        // Named through the root's re-export: an arrow to `options`, not to lib.rs.
        (
            "src/accept.rs",
            "use crate::Options; pub struct Listener(Options);",
        ),
        (
            "src/options.rs",
            "pub struct Options; \
             #[cfg(test)] mod tests { use crate::accept::Listener; } \
             fn f() { std::mem::drop(axum::Router::new()); }",
        ),
    ]);
    assert!(circles.is_empty(), "{circles:?}");
}
