//! ITX expressions: a JSON array of steps, each a property name or a call
//! `[method, ...args]`, ending in a property that names the method to call.
//! This module validates their shape; resolution and calls come with the
//! components runtime.

use serde_json::Value;

/// Property names that may never appear in an expression.
pub const RESERVED_PROPERTY_NAMES: &[&str] = &["__proto__", "constructor", "prototype"];
/// Most steps in one expression.
pub const STEPS_MAX: usize = 32;

/// Checks an expression's shape; `at` names it in errors (`payload.receiver.expression`).
pub fn validate_expression(at: &str, expression: &Value) -> Result<(), String> {
    let steps = expression
        .as_array()
        .ok_or_else(|| format!("{at} must be a JSON array of steps, got {expression}"))?;
    if steps.is_empty() {
        return Err(format!(
            "{at} is empty: it needs at least one property step"
        ));
    }
    if steps.len() > STEPS_MAX {
        return Err(format!(
            "{at} has {} steps, over the limit of {STEPS_MAX}",
            steps.len()
        ));
    }
    for (i, step) in steps.iter().enumerate() {
        let name = match step {
            Value::String(s) => s.as_str(),
            Value::Array(call) => match call.first() {
                Some(Value::String(m)) => m.as_str(),
                _ => {
                    return Err(format!(
                        "{at}[{i}] is a call step and must start with a method name, got {step}"
                    ))
                }
            },
            other => {
                return Err(format!(
                    "{at}[{i}] must be a property name or a call [method, ...args], got {other}"
                ))
            }
        };
        if name.is_empty() {
            return Err(format!("{at}[{i}] names an empty property"));
        }
        if RESERVED_PROPERTY_NAMES.contains(&name) {
            return Err(format!(
                "{at}[{i}] uses the reserved property name {name:?}"
            ));
        }
    }
    if !steps.last().is_some_and(Value::is_string) {
        return Err(format!(
            "{at} must end with a property step naming the method, got {}",
            steps.last().expect("non-empty")
        ));
    }
    Ok(())
}

/// What an expression resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An exported function of a deployed component of the project.
    ComponentFunction { component: String, function: String },
}

/// Where resolution stands after some steps. Adding a root or a step kind is
/// one variant and one match arm.
enum Node {
    Root,
    Components,
    Component(String),
    Function(String, String),
}

/// Resolves an expression against the project root
/// `{"components": {get(name) -> component}}`.
pub fn resolve(expression: &Value) -> Result<Target, String> {
    validate_expression("expression", expression)?;
    let steps = expression.as_array().expect("validated");
    let mut node = Node::Root;
    for (i, step) in steps.iter().enumerate() {
        node = match (node, step) {
            (Node::Root, Value::String(s)) if s == "components" => Node::Components,
            (Node::Root, Value::String(s)) => {
                return Err(format!(
                    "expression[{i}]: unknown root property {s:?} (the root has \"components\")"
                ))
            }
            (Node::Components, Value::Array(call)) => match call.as_slice() {
                [Value::String(m), Value::String(name)] if m == "get" => {
                    Node::Component(name.clone())
                }
                _ => {
                    return Err(format!(
                        "expression[{i}]: components has one method, [\"get\", NAME], got {step}"
                    ))
                }
            },
            (Node::Component(c), Value::String(f)) => Node::Function(c, f.clone()),
            (_, step) => return Err(format!("expression[{i}]: {step} does not apply here")),
        };
    }
    match node {
        Node::Function(component, function) => Ok(Target::ComponentFunction {
            component,
            function,
        }),
        _ => Err("the expression must end with a property naming a function".into()),
    }
}

/// The component a `processor-wake` expression names:
/// `["components", ["get", NAME], "wake"]`.
pub fn wake_component(expression: &Value) -> Result<String, String> {
    component_with_method(expression, "wake", "processor-wake")
}

/// The component a `reactor` expression names:
/// `["components", ["get", NAME], "react"]`.
pub fn reactor_component(expression: &Value) -> Result<String, String> {
    component_with_method(expression, "react", "reactor")
}

fn component_with_method(expression: &Value, method: &str, action: &str) -> Result<String, String> {
    let steps = expression.as_array().map(Vec::as_slice).unwrap_or(&[]);
    match steps {
        [Value::String(root), Value::Array(get), Value::String(m)]
            if root == "components" && m == method =>
        {
            match get.as_slice() {
                [Value::String(g), Value::String(name)] if g == "get" => Ok(name.clone()),
                _ => Err(format!("expected [\"get\", NAME] as the second step, got {}", Value::Array(get.clone()))),
            }
        }
        _ => Err(format!(
            "a {action} expression must read [\"components\", [\"get\", NAME], \"{method}\"], got {expression}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes() {
        assert!(validate_expression(
            "e",
            &json!(["components", ["get", "billing"], "process-event-batch"])
        )
        .is_ok());
        let e = validate_expression("e", &json!(["components", ["get", "billing"]])).unwrap_err();
        assert!(e.contains("property step"), "{e}");
        let e = validate_expression("e", &json!(["components", "__proto__", "x"])).unwrap_err();
        assert!(e.contains("\"__proto__\""), "{e}");
        let e = validate_expression("e", &json!([["constructor"], "x"])).unwrap_err();
        assert!(e.contains("constructor"), "{e}");
        assert!(validate_expression("e", &json!([])).is_err());
        assert!(validate_expression("e", &json!("x")).is_err());
        assert!(validate_expression("e", &json!([1, "x"])).is_err());
    }
}
