# cuDNN and NCCL as imported targets trident::cudnn and trident::nccl.
# They are looked for in the CUDA toolkit first, then in TRIDENT_CUDA_LIB_HINTS (a list of
# prefixes, e.g. the nvidia/cudnn and nvidia/nccl folders of pip wheels, which hold include/
# and lib/ with only versioned .so names such as libcudnn.so.9).
set(TRIDENT_CUDA_LIB_HINTS "" CACHE STRING "Extra prefixes holding include/ and lib/ of cuDNN and NCCL")

function(trident_find_cuda_lib target header libname)
  set(prefixes ${TRIDENT_CUDA_LIB_HINTS} ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda /usr)
  find_path(${target}_INCLUDE ${header}
            HINTS ${CUDAToolkit_INCLUDE_DIRS} PATHS ${prefixes} PATH_SUFFIXES include)
  find_library(${target}_LIBRARY NAMES ${libname} lib${libname}.so.9 lib${libname}.so.2
               HINTS ${CUDAToolkit_LIBRARY_DIR} PATHS ${prefixes} PATH_SUFFIXES lib lib64)
  if(NOT ${target}_INCLUDE OR NOT ${target}_LIBRARY)
    message(FATAL_ERROR "TRIDENT_CUDA=ON needs ${header} and lib${libname}: not found in the CUDA "
                        "toolkit or TRIDENT_CUDA_LIB_HINTS (${TRIDENT_CUDA_LIB_HINTS}); "
                        "configure with -DTRIDENT_CUDA=OFF to build without the CUDA backend")
  endif()
  add_library(trident::${target} UNKNOWN IMPORTED)
  set_target_properties(trident::${target} PROPERTIES IMPORTED_LOCATION ${${target}_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${${target}_INCLUDE})
  message(STATUS "trident: ${libname} ${${target}_LIBRARY}")
endfunction()

trident_find_cuda_lib(cudnn cudnn.h cudnn)
trident_find_cuda_lib(nccl nccl.h nccl)
