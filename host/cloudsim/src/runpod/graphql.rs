//! A small GraphQL reader for the RunPod simulator: operations with selection sets, aliases,
//! arguments with literal values or `$variables`, and projection of a result onto a selection.
//!
//! Not a GraphQL server: no fragments, directives or schema introspection; the resolvers in
//! `gql` check field names against the shapes RunPod documents.

use serde_json::{Map, Value};

/// A selected field.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Selection {
    pub alias: Option<String>,
    pub name: String,
    pub args: Map<String, Value>,
    pub fields: Vec<Selection>,
}

impl Selection {
    /// The key the field has in the response.
    pub fn key(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.name)
    }
}

/// A parsed operation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Operation {
    pub mutation: bool,
    pub fields: Vec<Selection>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Punct(char),
    Name(String),
    Str(String),
    Num(f64, bool),
}

fn lex(source: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            c if c.is_whitespace() || c == ',' => {}
            '#' => {
                i = chars[i..]
                    .iter()
                    .position(|c| *c == '\n')
                    .map_or(chars.len(), |p| i + p)
            }
            '{' | '}' | '(' | ')' | '[' | ']' | ':' | '$' | '!' | '=' | '@' => {
                tokens.push(Token::Punct(c))
            }
            '"' => i = lex_string(&chars, i, &mut tokens)?,
            c if c.is_ascii_digit() || c == '-' => i = lex_number(&chars, i - 1, &mut tokens)?,
            c if c.is_alphabetic() || c == '_' => {
                let end = chars[i..]
                    .iter()
                    .position(|c| !(c.is_alphanumeric() || *c == '_'))
                    .map_or(chars.len(), |p| i + p);
                tokens.push(Token::Name(chars[i - 1..end].iter().collect()));
                i = end;
            }
            other => return Err(format!("Syntax Error: Unexpected character \"{other}\".")),
        }
    }
    Ok(tokens)
}

fn lex_string(chars: &[char], mut i: usize, tokens: &mut Vec<Token>) -> Result<usize, String> {
    let mut text = String::new();
    while i < chars.len() {
        match chars[i] {
            '"' => {
                tokens.push(Token::Str(text));
                return Ok(i + 1);
            }
            '\\' if i + 1 < chars.len() => {
                i += 1;
                text.push(match chars[i] {
                    'n' => '\n',
                    't' => '\t',
                    other => other,
                });
            }
            other => text.push(other),
        }
        i += 1;
    }
    Err("Syntax Error: Unterminated string.".to_string())
}

fn lex_number(chars: &[char], start: usize, tokens: &mut Vec<Token>) -> Result<usize, String> {
    let numeric = |c: &char| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E');
    let end = chars[start..]
        .iter()
        .position(|c| !numeric(c))
        .map_or(chars.len(), |p| start + p);
    let text: String = chars[start..end].iter().collect();
    let value = text
        .parse::<f64>()
        .map_err(|_| format!("Syntax Error: Invalid number \"{text}\"."))?;
    let is_int = !text.contains(['.', 'e', 'E']);
    tokens.push(Token::Num(value, is_int));
    Ok(end)
}

struct Parser<'a> {
    tokens: Vec<Token>,
    at: usize,
    variables: &'a Map<String, Value>,
}

/// Parses a document with one operation, substituting `variables`.
pub(crate) fn parse(source: &str, variables: &Map<String, Value>) -> Result<Operation, String> {
    let mut parser = Parser {
        tokens: lex(source)?,
        at: 0,
        variables,
    };
    let mutation = parser.header()?;
    let fields = parser.selection_set()?;
    match parser.peek() {
        None => Ok(Operation { mutation, fields }),
        Some(token) => Err(format!("Syntax Error: Unexpected {token:?}.")),
    }
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Result<Token, String> {
        let token = self
            .tokens
            .get(self.at)
            .cloned()
            .ok_or("Syntax Error: Unexpected <EOF>.")?;
        self.at += 1;
        Ok(token)
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        match self.next()? {
            Token::Punct(p) if p == c => Ok(()),
            other => Err(format!("Syntax Error: Expected \"{c}\", found {other:?}.")),
        }
    }

    fn eat(&mut self, c: char) -> bool {
        let hit = self.peek() == Some(&Token::Punct(c));
        if hit {
            self.at += 1;
        }
        hit
    }

    /// `query Name($v: T) ` / `mutation …` / nothing; returns whether it is a mutation.
    fn header(&mut self) -> Result<bool, String> {
        let mutation = match self.peek() {
            Some(Token::Name(word)) if word == "query" || word == "mutation" => word == "mutation",
            _ => return Ok(false),
        };
        self.at += 1;
        if matches!(self.peek(), Some(Token::Name(_))) {
            self.at += 1;
        }
        if self.eat('(') {
            while !self.eat(')') {
                self.next()?;
            }
        }
        Ok(mutation)
    }

    fn selection_set(&mut self) -> Result<Vec<Selection>, String> {
        self.expect('{')?;
        let mut fields = Vec::new();
        while !self.eat('}') {
            fields.push(self.field()?);
        }
        Ok(fields)
    }

    fn name(&mut self) -> Result<String, String> {
        match self.next()? {
            Token::Name(name) => Ok(name),
            other => Err(format!("Syntax Error: Expected Name, found {other:?}.")),
        }
    }

    fn field(&mut self) -> Result<Selection, String> {
        let mut name = self.name()?;
        let mut alias = None;
        if self.eat(':') {
            alias = Some(std::mem::replace(&mut name, self.name()?));
        }
        let mut args = Map::new();
        if self.eat('(') {
            while !self.eat(')') {
                let key = self.name()?;
                self.expect(':')?;
                args.insert(key, self.value()?);
            }
        }
        let fields = if self.peek() == Some(&Token::Punct('{')) {
            self.selection_set()?
        } else {
            Vec::new()
        };
        Ok(Selection {
            alias,
            name,
            args,
            fields,
        })
    }

    fn value(&mut self) -> Result<Value, String> {
        Ok(match self.next()? {
            Token::Punct('$') => {
                let name = self.name()?;
                self.variables
                    .get(&name)
                    .cloned()
                    .ok_or(format!("Variable \"${name}\" is not defined."))?
            }
            Token::Punct('[') => {
                let mut items = Vec::new();
                while !self.eat(']') {
                    items.push(self.value()?);
                }
                Value::Array(items)
            }
            Token::Punct('{') => {
                let mut object = Map::new();
                while !self.eat('}') {
                    let key = self.name()?;
                    self.expect(':')?;
                    object.insert(key, self.value()?);
                }
                Value::Object(object)
            }
            Token::Str(text) => Value::String(text),
            Token::Num(n, true) => Value::from(n as i64),
            Token::Num(n, false) => {
                serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)
            }
            Token::Name(word) => match word.as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                "null" => Value::Null,
                _ => Value::String(word),
            },
            Token::Punct(other) => return Err(format!("Syntax Error: Unexpected \"{other}\".")),
        })
    }
}

/// Projects `full` onto a selection; `Err` names a field the type does not have.
pub(crate) fn project(
    full: &Value,
    fields: &[Selection],
    type_name: &str,
) -> Result<Value, String> {
    if fields.is_empty() {
        return Ok(full.clone());
    }
    match full {
        Value::Array(items) => items
            .iter()
            .map(|item| project(item, fields, type_name))
            .collect::<Result<_, _>>()
            .map(Value::Array),
        Value::Object(object) => {
            let mut out = Map::new();
            for field in fields {
                let value = object.get(&field.name).ok_or_else(|| {
                    format!(
                        "Cannot query field \"{}\" on type \"{type_name}\".",
                        field.name
                    )
                })?;
                out.insert(
                    field.key().to_string(),
                    project(value, &field.fields, &field.name)?,
                );
            }
            Ok(Value::Object(out))
        }
        other => Ok(other.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_mutation_with_nested_input_enums_lists_and_variables_is_parsed() {
        let vars = json!({"bid": 0.2}).as_object().unwrap().clone();
        let doc = r#"mutation Rent { podRentInterruptable(input: {name: "a b", cloudType: SECURE,
            gpuCount: 1, bidPerGpu: $bid, env: [{key: "K", value: "V"}]}) { id m: machine { podHostId } } }"#;
        let op = parse(doc, &vars).unwrap();
        assert!(op.mutation);
        let root = &op.fields[0];
        assert_eq!(root.name, "podRentInterruptable");
        let input = &root.args["input"];
        assert_eq!(input["cloudType"], "SECURE");
        assert_eq!(input["gpuCount"], 1);
        assert_eq!(input["bidPerGpu"], 0.2);
        assert_eq!(input["env"][0]["value"], "V");
        assert_eq!(root.fields[1].key(), "m");
    }

    #[test]
    fn projection_keeps_only_selected_fields_and_rejects_unknown_ones() {
        let op = parse(
            "{ myself { pods { id runtime { uptimeInSeconds } } } }",
            &Map::new(),
        )
        .unwrap();
        let pods = &op.fields[0].fields[0];
        let full = json!([{"id": "p1", "name": "n", "runtime": {"uptimeInSeconds": 3, "x": 1}}]);
        assert_eq!(
            project(&full, &pods.fields, "Pod").unwrap(),
            json!([{"id": "p1", "runtime": {"uptimeInSeconds": 3}}])
        );
        let bad = parse("{ pod { bogus } }", &Map::new()).unwrap();
        assert!(
            project(&json!({"id": 1}), &bad.fields[0].fields, "Pod")
                .unwrap_err()
                .contains("bogus")
        );
    }

    #[test]
    fn unbalanced_documents_are_syntax_errors() {
        assert!(
            parse(
                "mutation { podTerminate(input: {podId: \"x\"}) ",
                &Map::new()
            )
            .is_err()
        );
    }
}
