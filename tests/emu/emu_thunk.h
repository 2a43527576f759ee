// Uniform entry points for the kernels compiled into the emulator library: emu_thunk_NAME(args)
// calls kernel NAME with its parameters read from an array of pointers (the shape of
// cuLaunchKernel's kernelParams), and emu_sig_NAME() spells the parameter types, one letter each
// (p pointer, i int, u unsigned, f float), for emulator.py to check the launcher's arguments against.
#pragma once
#include <type_traits>
#include <utility>

namespace emu {

template <class T>
constexpr char type_code() {
    if constexpr (std::is_pointer_v<T>) return 'p';
    else if constexpr (std::is_same_v<T, int>) return 'i';
    else if constexpr (std::is_same_v<T, unsigned>) return 'u';
    else if constexpr (std::is_same_v<T, float>) return 'f';
    else static_assert(sizeof(T) == 0, "unsupported kernel parameter type");
}

template <class... A, size_t... I>
void invoke(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}

template <class... A>
void invoke(void (*kernel)(A...), void** args) {
    invoke(kernel, args, std::index_sequence_for<A...>{});
}

template <class... A>
const char* signature(void (*)(A...)) {
    static const char codes[] = {type_code<std::remove_cv_t<A>>()..., '\0'};
    return codes;
}

}  // namespace emu

#define EMU_THUNK(name)                                                                   \
    extern "C" void emu_thunk_##name(void** args) { emu::invoke(name, args); }            \
    extern "C" const char* emu_sig_##name() { return emu::signature(name); }
