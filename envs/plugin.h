/* The C ABI of shared-library environment plug-ins (plug-in path 1).
 *
 * A plug-in is a shared library that exports one C function per API version it speaks:
 *
 *   const StriderEnvironmentApi* strider_environment_api_v1(void);
 *
 * Strider loads the library by path (`env: {library: path}`), looks that symbol up, and refuses
 * a library that does not export it or whose table reports another api_version, naming the
 * version it was built for. The version is bumped whenever this table or the JSON messages it
 * carries change incompatibly (kEnvironmentApiVersion in environment.h is the same number).
 *
 * Everything crosses as plain C: the table below, NUL-terminated UTF-8 strings, and integers.
 * The strings are the JSON messages of docs/environments.md ("Messages"), the same ones an
 * out-of-process environment sends over ZeroMQ.
 *
 * Ownership and threading:
 *   - Strings passed in are owned by Strider and valid only during the call.
 *   - Strings returned (through `const char**` out-parameters or as return values) are owned by
 *     the plug-in and must stay valid until the next call on the same environment (for
 *     describe: until the library is unloaded; for create and scripted_turn: until the next
 *     call of that function from the same thread).
 *   - Functions returning int return 0 on success and put the reply in *reply; any other value
 *     is an error and *reply is the message (plain text).
 *   - One environment is used by one thread at a time; different environments may be used from
 *     different threads at once, so plug-ins keep no mutable global state.
 *   - A crash in a plug-in takes the actor down (it runs in-process): environments that run
 *     untrusted code or may crash belong out of process (plug-in path 2).
 *
 * See envs/template/template_env.cc for a complete, commented plug-in.
 */
#ifndef STRIDER_ENVS_PLUGIN_H_
#define STRIDER_ENVS_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STRIDER_ENVIRONMENT_API_VERSION 1

/* An environment instance; its layout is the plug-in's own. */
typedef struct StriderEnvironment StriderEnvironment;

typedef struct StriderEnvironmentApi {
  /* STRIDER_ENVIRONMENT_API_VERSION as the plug-in was compiled. */
  uint32_t api_version;
  /* sizeof(StriderEnvironmentApi) as the plug-in was compiled. */
  uint32_t struct_size;

  /* The describe reply: {"name", "description", "tools": [...], "max_turns", "options": [...]}. */
  const char* (*describe)(void);

  /* A new environment configured with the options object ({"key": "value"}); NULL on error,
   * with *error set to the message. */
  StriderEnvironment* (*create)(const char* options_json, const char** error);

  /* Starts an episode. reply: an observation object. */
  int (*reset)(StriderEnvironment* env, uint64_t seed, const char* episode_options_json,
               const char** reply);

  /* One model turn. action_json: {"text", "tool_call": {"name", "arguments"} or null,
   * "tool_call_error"}. reply: a step object {"observation", "reward", "label", "done",
   * "outcome_reward", "info"}. */
  int (*step)(StriderEnvironment* env, const char* action_json, const char** reply);

  /* Frees the environment. */
  void (*destroy)(StriderEnvironment* env);

  /* Optional (NULL when absent): the scripted policy. observations_json is the list of
   * observation objects so far; reply: the text of the next model turn. */
  int (*scripted_turn)(const char* observations_json, const char** reply);
} StriderEnvironmentApi;

typedef const StriderEnvironmentApi* (*StriderEnvironmentEntryPoint)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRIDER_ENVS_PLUGIN_H_ */
