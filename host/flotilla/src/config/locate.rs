//! From a key path to its line: walks the `toml_edit` document parsed from the original text.

use flotilla_validate::Seg;

/// Finds the line of a key path in the document as written.
pub(crate) struct Locator {
    doc: Option<toml_edit::Document<String>>,
    text: String,
}

#[derive(Clone, Copy)]
enum Node<'a> {
    Item(&'a toml_edit::Item),
    Table(&'a toml_edit::Table),
    Value(&'a toml_edit::Value),
}

impl Locator {
    pub(crate) fn new(text: &str) -> Self {
        Locator {
            doc: text.parse::<toml_edit::Document<String>>().ok(),
            text: text.to_string(),
        }
    }

    /// The 1-based line holding byte `offset`.
    pub(super) fn line_of(&self, offset: usize) -> usize {
        self.text
            .get(..offset.min(self.text.len()))
            .unwrap_or_default()
            .matches('\n')
            .count()
            + 1
    }

    /// The line of the deepest element of `path` that exists.
    pub(crate) fn line(&self, path: &[Seg]) -> Option<usize> {
        let doc = self.doc.as_ref()?;
        find(Node::Table(doc.as_table()), path, None).map(|o| self.line_of(o))
    }
}

/// The start offset of the deepest element of `path` that exists.
fn find(node: Node<'_>, path: &[Seg], best: Option<usize>) -> Option<usize> {
    let Some((seg, rest)) = path.split_first() else {
        return best;
    };
    match seg {
        Seg::Key(key) => {
            let table: &dyn toml_edit::TableLike = match node {
                Node::Table(t) => t,
                Node::Item(toml_edit::Item::Table(t)) => t,
                Node::Item(toml_edit::Item::Value(toml_edit::Value::InlineTable(t))) => t,
                Node::Value(toml_edit::Value::InlineTable(t)) => t,
                _ => return best,
            };
            let Some((k, v)) = table.get_key_value(key) else {
                return best;
            };
            let best = k.span().map(|s| s.start).or(best);
            find(Node::Item(v), rest, best)
        }
        Seg::Index(i) => match node {
            Node::Item(toml_edit::Item::ArrayOfTables(a)) => match a.get(*i) {
                Some(t) => find(Node::Table(t), rest, t.span().map(|s| s.start).or(best)),
                None => best,
            },
            Node::Item(toml_edit::Item::Value(toml_edit::Value::Array(a)))
            | Node::Value(toml_edit::Value::Array(a)) => match a.get(*i) {
                Some(v) => find(Node::Value(v), rest, v.span().map(|s| s.start).or(best)),
                None => best,
            },
            _ => best,
        },
    }
}
