//! Key templates: text with `${param}` references (`concurrency.key: "${customer}"`).
//!
//! One scanner, [`pieces`], reads a template; checking a template when a file is applied,
//! filling it in for a run and listing the params a trigger lacks all walk its pieces.

use super::values::is_valid_env_name;

/// One piece of a template, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'t> {
    /// Literal text.
    Text(&'t str),
    /// The name inside `${…}`.
    Param(&'t str),
    /// A `${` without its `}` and the rest of the template after it, kept as text.
    Unclosed(&'t str),
}

/// The pieces of `template`, left to right.
pub fn pieces(template: &str) -> impl Iterator<Item = Piece<'_>> {
    let mut rest = template;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let Some(start) = rest.find("${") else {
            let text = rest;
            rest = "";
            return Some(Piece::Text(text));
        };
        if start > 0 {
            let text = &rest[..start];
            rest = &rest[start..];
            return Some(Piece::Text(text));
        }
        match rest[2..].find('}') {
            Some(end) => {
                let name = &rest[2..2 + end];
                rest = &rest[2 + end + 1..];
                Some(Piece::Param(name))
            }
            None => {
                let text = rest;
                rest = "";
                Some(Piece::Unclosed(text))
            }
        }
    })
}

/// Checks a run-key template: text with at least one `${param}` whose name is a valid
/// environment variable name.
pub fn check_key_template(template: &str) -> Result<(), String> {
    let mut names = 0;
    for piece in pieces(template) {
        match piece {
            Piece::Text(_) => {}
            Piece::Unclosed(_) => {
                return Err(format!("unclosed \"${{\" in key template \"{template}\""));
            }
            Piece::Param(name) if !is_valid_env_name(name) => {
                return Err(format!(
                    "\"${{{name}}}\" in key template \"{template}\" is not a param name \
                     ([A-Za-z_][A-Za-z0-9_]*)"
                ));
            }
            Piece::Param(_) => names += 1,
        }
    }
    if names == 0 {
        return Err(format!(
            "key template \"{template}\" names no param: use ${{name}}, e.g. \"${{customer}}\""
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_in_order() {
        let all: Vec<Piece> = pieces("a-${x}${y}-b-${z").collect();
        assert_eq!(
            all,
            [
                Piece::Text("a-"),
                Piece::Param("x"),
                Piece::Param("y"),
                Piece::Text("-b-"),
                Piece::Unclosed("${z"),
            ]
        );
        assert_eq!(pieces("").count(), 0);
        assert_eq!(pieces("${}").collect::<Vec<_>>(), [Piece::Param("")]);
    }
}
