//! The template deploys what it deployed before its loops (issue 19):
//! `template.yaml` is written with `Fn::ForEach` under
//! `AWS::LanguageExtensions`, and its translation (the loops expanded, the
//! SAM transform applied, the dev and the prod parameter sets, as
//! `infra/template_check.py translate` does it) must hold exactly the
//! resources, outputs, conditions, rules and parameters recorded in
//! `tests/fixtures/template_inventory/` (each by the hash of its sorted-key
//! JSON, with every resource's type and every alarm's metric readable
//! there). The check also expands the template with ministack's own
//! `AWS::LanguageExtensions` (what the local stack deploys through) and
//! requires the same result as cfn-lint's expander. A deliberate change of
//! the stack records the new inventory:
//! `.venv/bin/python infra/template_check.py inventory --write`.
//! Needs `.venv` (infra/tools.sh), no stack.

use system_tests::template_check;

#[test]
fn the_template_translates_to_the_recorded_resources_outputs_and_policies() {
    template_check("template_check.py", "baseline");
}
