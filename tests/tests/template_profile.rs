//! The production profile, checked on the template: the local emulator
//! accepts the template's `Rules` without evaluating them and lets any
//! signature through an AWS_IAM route, so the end-to-end suites cannot show
//! what a prod stack refuses. Each test runs one check of
//! `infra/check_profile.py` (the Rules evaluated for refused and accepted
//! parameter sets; the SAM-translated prod and dev stacks; the payment
//! notifications' own API).

use system_tests::template_check;

#[test]
fn the_rules_refuse_test_switches_in_prod_a_shared_sandbox_secret_and_half_an_auth_setting() {
    template_check("check_profile.py", "rules");
}

#[test]
fn a_prod_stack_has_no_sandbox_resource_and_no_fault_switch() {
    template_check("check_profile.py", "prod");
}

#[test]
fn buyer_routes_need_a_token_admin_and_settle_routes_need_iam() {
    template_check("check_profile.py", "routes");
}

#[test]
fn provider_notifications_have_their_own_api_throttle_log_and_concurrency() {
    template_check("check_profile.py", "notify");
}
